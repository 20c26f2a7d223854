//! Status writes by server-side apply, one field manager per group of fields (ADR 0020).
//!
//! Every status field belongs to exactly one [`Group`], and every group has its own field
//! manager (`ichor_api::names::field_managers`). A write compares the status it started from
//! with the one it wants and applies each group that differs, whole: the apiserver then keeps
//! every field the group no longer sends cleared, and never touches another group's fields.
//! Conditions are a list-map keyed by type, so a group owns its condition types and no other.
//! No writer strips or re-sends another's fields.

use std::fmt::Debug;

use ichor_api::names::{conditions, field_managers as fm};
use ichor_api::status::Part;
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// The conditions a group owns.
#[derive(Debug, Clone, Copy)]
pub enum Owned {
    /// None.
    None,
    /// Only these types.
    Only(&'static [&'static str]),
    /// Every type no other group of the kind names.
    Rest,
}

/// Status fields written together by one field manager.
#[derive(Debug, Clone, Copy)]
pub struct Group {
    /// The field manager.
    pub manager: &'static str,
    /// The status fields (JSON names), but conditions.
    pub fields: &'static [&'static str],
    /// The condition types.
    pub conditions: Owned,
}

/// `ReconcilePanicked`, in every kind's status: written where a panicking reconcile is caught
/// (`crate::infra::panics`), so no other group sends or clears it.
pub const PANIC: Group = Group {
    manager: fm::RECONCILE_PANIC,
    fields: &[],
    conditions: Owned::Only(&[conditions::RECONCILE_PANICKED]),
};

/// The groups of TalosCluster status.
pub const CLUSTER: &[Group] = &[
    Group {
        manager: fm::CLUSTER_STATUS,
        fields: &[
            "observedGeneration",
            "controlPlanes",
            "workers",
            "bootstrap",
            "bundleFingerprint",
            "secretsSecret",
            "talosconfigSecret",
            "kubeconfigSecret",
            "credentials",
            "adoption",
        ],
        conditions: Owned::Rest,
    },
    Group {
        manager: fm::CLUSTER_LOCK,
        fields: &["lock"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::CLUSTER_TOMBSTONES,
        fields: &["tombstones"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::CLUSTER_DRIFT,
        fields: &["driftHalt"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::CLUSTER_NODE_DELETES,
        fields: &["pendingNodeDeletes"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::BACKUP_STATUS,
        fields: &["backup"],
        conditions: Owned::Only(&[conditions::BACKED_UP]),
    },
    Group {
        manager: fm::RESTORE_STATUS,
        fields: &["restore"],
        conditions: Owned::Only(&[conditions::RESTORED]),
    },
    PANIC,
];

/// The groups of TalosMachine status.
pub const MACHINE: &[Group] = &[
    Group {
        manager: fm::MACHINE_LIFECYCLE,
        fields: &["phase", "observedGeneration", "nodeName", "etcdMemberId"],
        conditions: Owned::Rest,
    },
    Group {
        manager: fm::MACHINE_APPLIED,
        fields: &["appliedConfigHash"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::MACHINE_DRIFT,
        fields: &["driftReboot", "driftBootId"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::MACHINE_INVENTORY,
        fields: &["address", "observedFingerprint", "talosVersion", "hardware"],
        conditions: Owned::Only(&[conditions::FINGERPRINT_CHANGED]),
    },
    Group {
        manager: fm::MACHINE_ETCD,
        fields: &["etcd"],
        conditions: Owned::None,
    },
    Group {
        manager: fm::MACHINE_REMOVAL,
        fields: &["removal"],
        conditions: Owned::Only(&[conditions::REMOVAL_APPROVED]),
    },
    Group {
        manager: fm::MACHINE_CLASS,
        fields: &[],
        conditions: Owned::Only(&[conditions::CLASS_MATCHED]),
    },
    PANIC,
];

/// The groups of TalosOperation status.
pub const OPERATION: &[Group] = &[
    Group {
        manager: fm::OPERATION_STATUS,
        fields: &["phase", "progress", "nodes", "startedAt", "completedAt"],
        conditions: Owned::Rest,
    },
    Group {
        manager: fm::OPERATION_BACKUP,
        fields: &["backupKey"],
        conditions: Owned::None,
    },
    PANIC,
];

/// A custom resource whose status is written in groups.
pub trait Grouped:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize
{
    /// Its status type.
    type Status: Serialize + DeserializeOwned + ichor_api::status::Grouped;
    /// Its groups: every status field in exactly one.
    const GROUPS: &'static [Group];
    /// Its status, if any.
    fn status_of(&self) -> Option<&Self::Status>;
    /// Its status's conditions (none without a status).
    fn conditions_of(&self) -> &[ichor_api::common::Condition];
}

impl Grouped for TalosCluster {
    type Status = ichor_api::cluster::TalosClusterStatus;
    const GROUPS: &'static [Group] = CLUSTER;
    fn status_of(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

impl Grouped for TalosMachine {
    type Status = ichor_api::machine::TalosMachineStatus;
    const GROUPS: &'static [Group] = MACHINE;
    fn status_of(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

/// The groups of TalosMachineClass status: one writer, and [`PANIC`].
pub const CLASS: &[Group] = &[
    Group {
        manager: fm::CLASS_STATUS,
        fields: &["matchedMachines", "machines", "waiting"],
        conditions: Owned::Rest,
    },
    PANIC,
];

/// The groups of TalosStorage status: one writer, and [`PANIC`].
pub const STORAGE: &[Group] = &[
    Group {
        manager: fm::STORAGE_STATUS,
        fields: &["volumeCount", "machines"],
        conditions: Owned::Rest,
    },
    PANIC,
];

impl Grouped for ichor_api::TalosMachineClass {
    type Status = ichor_api::class::TalosMachineClassStatus;
    const GROUPS: &'static [Group] = CLASS;
    fn status_of(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

impl Grouped for ichor_api::TalosStorage {
    type Status = ichor_api::storage::TalosStorageStatus;
    const GROUPS: &'static [Group] = STORAGE;
    fn status_of(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

impl Grouped for TalosOperation {
    type Status = ichor_api::operation::TalosOperationStatus;
    const GROUPS: &'static [Group] = OPERATION;
    fn status_of(&self) -> Option<&Self::Status> {
        self.status.as_ref()
    }
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status.as_ref().map_or(&[], |s| &s.conditions)
    }
}

/// Whether a condition of `type_` belongs to `group` among `groups`.
fn owns_condition(group: &Group, groups: &[Group], type_: &str) -> bool {
    match group.conditions {
        Owned::None => false,
        Owned::Only(types) => types.contains(&type_),
        Owned::Rest => !groups.iter().any(|g| match g.conditions {
            Owned::Only(types) => types.contains(&type_),
            _ => false,
        }),
    }
}

/// The part of `status` (a JSON object) that `group` writes.
pub fn project(group: &Group, groups: &[Group], status: &Value) -> Map<String, Value> {
    let mut out = Map::new();
    let Some(all) = status.as_object() else {
        return out;
    };
    for field in group.fields {
        if let Some(value) = all.get(*field).filter(|v| !v.is_null()) {
            out.insert((*field).to_owned(), value.clone());
        }
    }
    if !matches!(group.conditions, Owned::None) {
        let owned: Vec<Value> = all
            .get("conditions")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter(|c| {
                c.get("type")
                    .and_then(Value::as_str)
                    .is_some_and(|t| owns_condition(group, groups, t))
            })
            .cloned()
            .collect();
        if !owned.is_empty() {
            out.insert("conditions".to_owned(), Value::Array(owned));
        }
    }
    out
}

/// The groups whose part differs between `old` and `new`.
pub fn changed<'g>(groups: &'g [Group], old: &Value, new: &Value) -> Vec<&'g Group> {
    groups
        .iter()
        .filter(|g| project(g, groups, old) != project(g, groups, new))
        .collect()
}

/// Applies `status` to object `name` as field manager `manager`, checked against
/// `resource_version` when there is one (which then becomes the version written).
async fn apply_one<K: Grouped>(
    api: &Api<K>,
    name: &str,
    manager: &str,
    status: Map<String, Value>,
    resource_version: &mut Option<String>,
) -> Result<(), kube::Error> {
    let mut metadata = json!({ "name": name });
    if let Some(version) = resource_version.as_ref() {
        metadata["resourceVersion"] = json!(version);
    }
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": status,
    });
    let written = api
        .patch_status(
            name,
            &PatchParams::apply(manager).force(),
            &Patch::Apply(body),
        )
        .await?;
    if resource_version.is_some() {
        *resource_version = written.resource_version();
    }
    Ok(())
}

/// Applies each group of `new` that differs from `old` to object `name`, with that group's
/// field manager (only `only`'s, when given). With `resource_version`, the first apply fails
/// with a conflict if the object changed since it was read.
async fn apply_changed<K: Grouped>(
    api: &Api<K>,
    name: &str,
    old: &Value,
    new: &Value,
    mut resource_version: Option<String>,
    only: Option<&str>,
) -> Result<(), kube::Error> {
    let groups = changed(K::GROUPS, old, new);
    for group in groups
        .into_iter()
        .filter(|g| only.is_none_or(|m| m == g.manager))
    {
        let after = project(group, K::GROUPS, new);
        apply_one(api, name, group.manager, after, &mut resource_version).await?;
    }
    Ok(())
}

/// Whether `object`'s status has fields owned by an update (a merge patch by an earlier
/// manager): a group sharing such a field with it could never clear it.
fn has_updated_status(object: &impl Resource) -> bool {
    object
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .any(is_status_update)
}

/// Keeps of `object`'s managed fields only what a status write reads of a cached copy: the
/// entries owned by a status update ([`write()`] hands those to their groups). Every other
/// entry, each field manager's whole field set, is most of a cached machine's memory, and
/// nothing decides on it (ADR 0039).
pub fn slim<K: Resource>(object: &mut K) {
    if let Some(fields) = object.meta_mut().managed_fields.as_mut() {
        fields.retain(is_status_update);
    }
}

fn is_status_update(entry: &ManagedFieldsEntry) -> bool {
    entry.subresource.as_deref() == Some("status") && entry.operation.as_deref() == Some("Update")
}

/// Drops the status entries owned by updates from `object`'s managed fields, checked against
/// the version read, so that each status field is owned by its group alone once the group
/// applies it. Returns the version written, or `None` when another writer came first.
async fn forget_updated_status<K: Grouped>(
    api: &Api<K>,
    object: &K,
) -> Result<Option<String>, kube::Error> {
    let kept: Vec<_> = object
        .meta()
        .managed_fields
        .iter()
        .flatten()
        .filter(|e| !is_status_update(e))
        .cloned()
        .collect();
    // An empty list leaves managed fields as they are; one empty entry clears them.
    let kept = if kept.is_empty() {
        json!([{}])
    } else {
        json!(kept)
    };
    let patch: json_patch::Patch = serde_json::from_value(json!([
        {"op": "test", "path": "/metadata/resourceVersion", "value": object.resource_version()},
        {"op": "replace", "path": "/metadata/managedFields", "value": kept},
    ]))
    .map_err(kube::Error::SerdeError)?;
    match api
        .patch(
            &object.name_any(),
            &PatchParams::default(),
            &Patch::<()>::Json(patch),
        )
        .await
    {
        Ok(written) => Ok(written.resource_version()),
        Err(kube::Error::Api(s)) if s.is_conflict() || s.code == 422 => Ok(None),
        // Not granted for this kind (TalosOperations are never patched): left as it is, and
        // the write goes on; an operation's status is written once per step anyway.
        Err(kube::Error::Api(s)) if s.is_forbidden() => Ok(object.resource_version()),
        Err(e) => Err(e),
    }
}

/// Hands the status fields an earlier manager owns by update to their groups: drops those
/// entries from the managed fields and has each group apply its part of the status as `object`
/// holds it, all checked against `object`'s version, so only current values are applied. A
/// group owns every field it may later clear (a group cannot clear a field it never applied).
/// Returns the version written, or `None` when the object changed since it was read.
async fn adopt<K: Grouped>(api: &Api<K>, object: &K) -> Result<Option<String>, kube::Error> {
    // A cached copy keeps its status-update entries alone ([`slim`]): the entries that stay
    // are read from the object as stored, at the version the caller read.
    let stored = api.get(&object.name_any()).await?;
    if stored.resource_version() != object.resource_version() {
        return Ok(None);
    }
    let Some(mut version) = forget_updated_status(api, &stored).await? else {
        return Ok(None);
    };
    let current = to_value(object.status_of());
    let name = object.name_any();
    for group in K::GROUPS {
        let part = project(group, K::GROUPS, &current);
        if part.is_empty() {
            continue;
        }
        let mut checked = Some(version.clone());
        match apply_one(api, &name, group.manager, part, &mut checked).await {
            Ok(()) => version = checked.unwrap_or(version),
            Err(kube::Error::Api(s)) if s.is_conflict() => return Ok(None),
            Err(e) => return Err(e),
        }
    }
    Ok(Some(version))
}

fn to_value(status: Option<&impl Serialize>) -> Value {
    status
        .and_then(|s| serde_json::to_value(s).ok())
        .unwrap_or_else(|| json!({}))
}

/// Writes `new` as the status of `object`: each group that differs from the status `object`
/// carries (only `only`'s, when given), checked against `object`'s version when `checked`.
/// Status fields an earlier manager owns by update are first handed to their groups.
async fn write_groups<K: Grouped>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
    checked: bool,
    only: Option<&str>,
) -> Result<(), kube::Error> {
    let mut version = object.resource_version();
    if has_updated_status(object) {
        match adopt(api, object).await? {
            Some(written) => version = Some(written),
            None if checked => {
                // Changed since it was read: the caller's read-modify-write starts again.
                let mut status = kube::core::Status::failure("changed since read", "Conflict");
                status.code = 409;
                return Err(kube::Error::Api(Box::new(status)));
            }
            None => {}
        }
    }
    let old = to_value(object.status_of());
    let version = version.filter(|_| checked);
    let name = object.name_any();
    apply_changed(api, &name, &old, &to_value(Some(new)), version, only).await
}

/// Writes `new` as the status of `object`, group by group: only the groups that differ from
/// the status `object` carries.
pub async fn write<K: Grouped>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
) -> Result<(), kube::Error> {
    write_groups(api, object, new, false, None).await
}

/// As [`write()`], but only the group of field manager `manager`: for a writer whose status
/// copy may not carry the other groups' current values.
pub async fn write_only<K: Grouped>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
    manager: &str,
) -> Result<(), kube::Error> {
    write_groups(api, object, new, false, Some(manager)).await
}

/// As [`write()`], but only if `object` is still the current version: a conflict otherwise,
/// for writers that read, modify and write (the lock's mirror, the tombstones).
pub async fn write_checked<K: Grouped>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
) -> Result<(), kube::Error> {
    write_groups(api, object, new, true, None).await
}

/// Whether [`apply()`] is refused when the object changed since the copy it was given was read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Guard {
    /// Applied whatever changed meanwhile: the group's fields are its writer's alone.
    None,
    /// Refused with a conflict if the object's `resourceVersion` moved since the copy was read:
    /// for a read-modify-write (the lock's mirror, the tombstones, a bootstrap record), retried
    /// on a fresh copy.
    Version,
}

/// Group `part`'s share of `status`: its fields (those set) and the conditions it owns.
pub fn project_part<S: ichor_api::status::Grouped>(
    part: &Part<S>,
    status: &S,
) -> Map<String, Value> {
    let mut out = match (part.fields)(status) {
        Value::Object(fields) => fields,
        _ => Map::new(),
    };
    out.retain(|_, value| !value.is_null());
    let owned: Vec<Value> = status
        .conditions()
        .iter()
        .filter(|c| part.owns(S::GROUPS, &c.type_))
        .filter_map(|c| serde_json::to_value(c).ok())
        .collect();
    if !owned.is_empty() {
        out.insert("conditions".to_owned(), Value::Array(owned));
    }
    out
}

/// Applies group `G` of `new` to `object` by server-side apply with `G`'s field manager: its
/// fields and the condition types it owns, whole, so whatever it no longer sends is cleared and
/// no other group's field or condition is sent or touched. Nothing is sent when `object`'s
/// status already holds exactly that part. With [`Guard::Version`], a conflict if `object` is
/// no longer the current version.
pub async fn apply<G, K>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
    guard: Guard,
) -> Result<(), kube::Error>
where
    K: Grouped,
    G: ichor_api::status::Group<K::Status>,
{
    let part = Part::of::<G>();
    let after = project_part(&part, new);
    let before = object
        .status_of()
        .map(|old| project_part(&part, old))
        .unwrap_or_default();
    if before == after {
        return Ok(());
    }
    let mut version = object
        .resource_version()
        .filter(|_| guard == Guard::Version);
    apply_one(api, &object.name_any(), part.manager, after, &mut version).await
}

/// Merges `fields` (JSON merge-patch semantics: `null` clears a field) into the current status
/// of object `name`, read fresh, and writes the groups that changed. Retried on a conflict.
pub async fn merge<K: Grouped>(
    api: &Api<K>,
    name: &str,
    fields: &Value,
) -> Result<(), kube::Error> {
    let mut attempts = 0;
    loop {
        let fresh = api.get(name).await?;
        let mut new = to_value(fresh.status_of());
        json_patch::merge(&mut new, fields);
        let new: K::Status = serde_json::from_value(new).map_err(kube::Error::SerdeError)?;
        match write_groups(api, &fresh, &new, true, None).await {
            Err(kube::Error::Api(s)) if s.is_conflict() && attempts < 5 => attempts += 1,
            other => return other,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use super::*;

    #[test]
    fn a_slim_copy_keeps_only_the_status_entries_owned_by_updates() {
        let entry =
            |manager: &str, operation: &str, subresource: Option<&str>| ManagedFieldsEntry {
                manager: Some(manager.into()),
                operation: Some(operation.into()),
                subresource: subresource.map(Into::into),
                ..Default::default()
            };
        let mut machine = TalosMachine::test("m").build();
        machine.metadata.managed_fields = Some(vec![
            entry("ichor-discovery", "Apply", None),
            entry("ichor-machine", "Apply", Some("status")),
            entry("kubectl", "Update", None),
        ]);
        slim(&mut machine);
        assert!(
            machine
                .metadata
                .managed_fields
                .iter()
                .flatten()
                .next()
                .is_none()
        );
        assert!(!has_updated_status(&machine));
        machine.metadata.managed_fields = Some(vec![
            entry("ichor-discovery", "Apply", None),
            entry("ichor-manager", "Update", Some("status")),
        ]);
        slim(&mut machine);
        let kept: Vec<_> = machine.metadata.managed_fields.iter().flatten().collect();
        assert_eq!(kept.len(), 1);
        assert_eq!(kept[0].manager.as_deref(), Some("ichor-manager"));
        assert!(
            has_updated_status(&machine),
            "what a status write reads stays"
        );
    }

    /// The status fields of `S` as its schema lists them.
    fn schema_fields<S: schemars::JsonSchema>() -> BTreeSet<String> {
        let schema = schemars::schema_for!(S);
        schema
            .get("properties")
            .and_then(Value::as_object)
            .expect("properties")
            .keys()
            .cloned()
            .collect()
    }

    fn partitions<S: schemars::JsonSchema>(groups: &[Group]) {
        let mut seen = BTreeSet::new();
        for group in groups {
            for field in group.fields {
                assert!(seen.insert((*field).to_owned()), "{field} in two groups");
            }
        }
        seen.insert("conditions".to_owned());
        assert_eq!(
            seen,
            schema_fields::<S>(),
            "every status field in exactly one group"
        );
        let rest = groups
            .iter()
            .filter(|g| matches!(g.conditions, Owned::Rest))
            .count();
        assert_eq!(rest, 1, "one group takes the conditions no other names");
    }

    #[test]
    fn every_status_field_has_exactly_one_group() {
        partitions::<ichor_api::cluster::TalosClusterStatus>(CLUSTER);
        partitions::<ichor_api::machine::TalosMachineStatus>(MACHINE);
        partitions::<ichor_api::operation::TalosOperationStatus>(OPERATION);
    }

    fn condition(type_: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    #[test]
    fn conditions_go_to_the_group_naming_them_and_the_rest_to_the_lifecycle() {
        let status = json!({
            "phase": "Ready",
            "address": "10.0.0.1",
            "conditions": [condition("Ready"), condition("FingerprintChanged"), condition("RemovalApproved")],
        });
        let types = |g: &Group| -> Vec<String> {
            project(g, MACHINE, &status)
                .get("conditions")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
                .map(|c| c["type"].as_str().unwrap().to_owned())
                .collect()
        };
        assert_eq!(types(&MACHINE[0]), ["Ready"]);
        assert_eq!(types(&MACHINE[3]), ["FingerprintChanged"]);
        assert_eq!(types(&MACHINE[5]), ["RemovalApproved"]);
        assert!(types(&MACHINE[1]).is_empty());
        assert_eq!(
            project(&MACHINE[3], MACHINE, &status)["address"],
            "10.0.0.1"
        );
        assert!(!project(&MACHINE[0], MACHINE, &status).contains_key("address"));
    }

    #[test]
    fn only_the_groups_that_changed_are_written() {
        let old = json!({"phase": "Ready", "driftReboot": "h1", "address": "10.0.0.1"});
        let mut new = old.clone();
        json_patch::merge(&mut new, &json!({"driftReboot": null}));
        let managers: Vec<_> = changed(MACHINE, &old, &new)
            .iter()
            .map(|g| g.manager)
            .collect();
        assert_eq!(managers, [fm::MACHINE_DRIFT]);
        assert!(project(&MACHINE[2], MACHINE, &new).is_empty());
        assert!(changed(MACHINE, &old, &old).is_empty());
    }

    #[test]
    fn the_panic_condition_is_written_by_its_own_group_in_every_kind() {
        let status = json!({"conditions": [condition("Ready"), condition("ReconcilePanicked")]});
        for groups in [CLUSTER, MACHINE, OPERATION, CLASS, STORAGE] {
            for group in groups {
                let types: Vec<String> = project(group, groups, &status)
                    .get("conditions")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                    .map(|c| c["type"].as_str().unwrap_or_default().to_owned())
                    .collect();
                let panics = types.iter().any(|t| t == "ReconcilePanicked");
                assert_eq!(
                    panics,
                    group.manager == fm::RECONCILE_PANIC,
                    "{}",
                    group.manager
                );
            }
        }
    }

    #[test]
    fn a_changed_condition_writes_only_its_owner() {
        let old = json!({"conditions": [condition("Ready"), condition("FingerprintChanged")]});
        let mut new = old.clone();
        new["conditions"][1]["status"] = json!("False");
        let managers: Vec<_> = changed(MACHINE, &old, &new)
            .iter()
            .map(|g| g.manager)
            .collect();
        assert_eq!(managers, [fm::MACHINE_INVENTORY]);
    }
}
