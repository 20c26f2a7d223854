//! Status writes by server-side apply, one field manager per group of fields (ADR 0020, 0061).
//!
//! Every status field belongs to exactly one group: a struct of `ichor_api` flattened into its
//! kind's status, with its field manager beside it (`ichor_api::status::Group`). [`apply()`]
//! applies one group whole: the apiserver then keeps every field the group no longer sends
//! cleared, and never touches another group's fields. Conditions are a list-map keyed by type,
//! so a group sends the condition types it owns and no other. No writer strips or re-sends
//! another's fields.

use std::fmt::Debug;

use ichor_api::status::{Group, Part};
use ichor_api::{TalosCluster, TalosMachine, TalosOperation};
use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt as _};
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

/// A custom resource whose status is written in groups.
pub trait Grouped:
    Resource<DynamicType = ()> + Clone + Debug + DeserializeOwned + Serialize
{
    /// Its status type, made of groups.
    type Status: Serialize + DeserializeOwned + ichor_api::status::Grouped;
    /// Its status, if any.
    fn status_of(&self) -> Option<&Self::Status>;
    /// Its status's conditions (none without a status).
    fn conditions_of(&self) -> &[ichor_api::common::Condition] {
        self.status_of()
            .map_or(&[], ichor_api::status::Grouped::conditions)
    }
}

macro_rules! grouped {
    ($($kind:ty: $status:ty),* $(,)?) => {$(
        impl Grouped for $kind {
            type Status = $status;
            fn status_of(&self) -> Option<&Self::Status> {
                self.status.as_ref()
            }
        }
    )*};
}

grouped!(
    TalosCluster: ichor_api::cluster::TalosClusterStatus,
    TalosMachine: ichor_api::machine::TalosMachineStatus,
    TalosOperation: ichor_api::operation::TalosOperationStatus,
    ichor_api::TalosMachineClass: ichor_api::class::TalosMachineClassStatus,
    ichor_api::TalosStorage: ichor_api::storage::TalosStorageStatus,
);

/// Drops `object`'s managed fields: nothing decides on them, and they are most of a cached
/// machine's memory (ADR 0039).
pub fn slim<K: Resource>(object: &mut K) {
    object.meta_mut().managed_fields = None;
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
pub fn project<S: ichor_api::status::Grouped>(part: &Part<S>, status: &S) -> Map<String, Value> {
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
    G: Group<K::Status>,
{
    apply_returning::<G, K>(api, object, new, guard)
        .await
        .map(drop)
}

/// [`apply()`], returning the object as the apiserver stored it (`None`: nothing was sent).
pub async fn apply_returning<G, K>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
    guard: Guard,
) -> Result<Option<K>, kube::Error>
where
    K: Grouped,
    G: Group<K::Status>,
{
    let part = Part::of::<G>();
    let after = project(&part, new);
    let before = object
        .status_of()
        .map(|old| project(&part, old))
        .unwrap_or_default();
    if before == after {
        return Ok(None);
    }
    send_part(api, object, &part, after, guard).await.map(Some)
}

/// Applies group `G` of `new` to `object` as [`apply()`] does, sent even when `object`'s status
/// already holds it: for a copy that may not be the current version, which only the apiserver
/// can tell (with [`Guard::Version`], a conflict). Returns the object as stored.
pub async fn send<G, K>(
    api: &Api<K>,
    object: &K,
    new: &K::Status,
    guard: Guard,
) -> Result<K, kube::Error>
where
    K: Grouped,
    G: Group<K::Status>,
{
    let part = Part::of::<G>();
    let after = project(&part, new);
    send_part(api, object, &part, after, guard).await
}

/// Applies `after`, group `part`'s share of a status, to `object` with the group's field
/// manager, checked against `object`'s version with [`Guard::Version`].
async fn send_part<K: Grouped>(
    api: &Api<K>,
    object: &K,
    part: &Part<K::Status>,
    after: Map<String, Value>,
    guard: Guard,
) -> Result<K, kube::Error> {
    let mut metadata = json!({ "name": object.name_any() });
    if guard == Guard::Version
        && let Some(version) = object.resource_version()
    {
        metadata["resourceVersion"] = json!(version);
    }
    let body = json!({
        "apiVersion": K::api_version(&()),
        "kind": K::kind(&()),
        "metadata": metadata,
        "status": after,
    });
    api.patch_status(
        &object.name_any(),
        &PatchParams::apply(part.manager).force(),
        &Patch::Apply(body),
    )
    .await
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use ichor_api::machine::TalosMachineStatus;
    use ichor_api::names::field_managers as fm;
    use ichor_api::status::{Grouped as _, Owned};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;

    use super::*;

    const MACHINE: &[Part<TalosMachineStatus>] = TalosMachineStatus::GROUPS;

    /// A status of type `S` read from its JSON.
    fn typed<S: DeserializeOwned>(status: &Value) -> S {
        serde_json::from_value(status.clone()).expect("a status")
    }

    /// The groups whose part differs between `old` and `new`.
    fn changed<S: ichor_api::status::Grouped>(old: &S, new: &S) -> Vec<&'static str> {
        S::GROUPS
            .iter()
            .filter(|g| project(g, old) != project(g, new))
            .map(|g| g.manager)
            .collect()
    }

    #[test]
    fn a_slim_copy_keeps_no_managed_fields() {
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

    fn partitions<S: schemars::JsonSchema + ichor_api::status::Grouped>() {
        let groups = S::GROUPS;
        let mut seen = BTreeSet::new();
        for group in groups {
            for field in (group.names)() {
                assert!(seen.insert(field.clone()), "{field} in two groups");
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
        partitions::<ichor_api::cluster::TalosClusterStatus>();
        partitions::<ichor_api::machine::TalosMachineStatus>();
        partitions::<ichor_api::operation::TalosOperationStatus>();
    }

    fn condition(type_: &str) -> Value {
        json!({"type": type_, "status": "True", "reason": "R", "message": "", "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    #[test]
    fn conditions_go_to_the_group_naming_them_and_the_rest_to_the_lifecycle() {
        let status: TalosMachineStatus = typed(&json!({
            "phase": "Ready",
            "address": "10.0.0.1",
            "conditions": [condition("Ready"), condition("FingerprintChanged"), condition("RemovalApproved")],
        }));
        let types = |g: &Part<TalosMachineStatus>| -> Vec<String> {
            project(g, &status)
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
        assert_eq!(project(&MACHINE[3], &status)["address"], "10.0.0.1");
        assert!(!project(&MACHINE[0], &status).contains_key("address"));
    }

    #[test]
    fn only_the_groups_that_changed_are_written() {
        let old = json!({"phase": "Ready", "driftReboot": "h1", "address": "10.0.0.1"});
        let mut new = old.clone();
        json_patch::merge(&mut new, &json!({"driftReboot": null}));
        let (old, new): (TalosMachineStatus, TalosMachineStatus) = (typed(&old), typed(&new));
        let managers = changed(&old, &new);
        assert_eq!(managers, [fm::MACHINE_DRIFT]);
        assert!(project(&MACHINE[2], &new).is_empty());
        assert!(changed(&old, &old).is_empty());
    }

    /// Which groups of `S` send `ReconcilePanicked` out of `status`: only the panic's.
    fn panics_alone<S: DeserializeOwned + ichor_api::status::Grouped>(status: &Value) {
        let status: S = typed(status);
        for group in S::GROUPS {
            let types: Vec<String> = project(group, &status)
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

    #[test]
    fn the_panic_condition_is_written_by_its_own_group_in_every_kind() {
        let status = json!({"conditions": [condition("Ready"), condition("ReconcilePanicked")]});
        panics_alone::<ichor_api::cluster::TalosClusterStatus>(&status);
        panics_alone::<TalosMachineStatus>(&status);
        panics_alone::<ichor_api::operation::TalosOperationStatus>(&status);
        panics_alone::<ichor_api::class::TalosMachineClassStatus>(&status);
        panics_alone::<ichor_api::storage::TalosStorageStatus>(&status);
    }

    #[test]
    fn a_changed_condition_writes_only_its_owner() {
        let old = json!({"conditions": [condition("Ready"), condition("FingerprintChanged")]});
        let mut new = old.clone();
        new["conditions"][1]["status"] = json!("False");
        let managers = changed::<TalosMachineStatus>(&typed(&old), &typed(&new));
        assert_eq!(managers, [fm::MACHINE_INVENTORY]);
    }
}
