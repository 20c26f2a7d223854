//! The one way the manager adds and removes its finalizers (ADR 0014). Both write the whole
//! finalizer list with the `resourceVersion` it was read at, so a concurrent writer makes the
//! patch conflict instead of being overwritten: first the copy in hand's (a watch's cache),
//! then, if that conflicts, a fresh read's. When a finalizer is added is
//! the caller's decision: a TalosMachine gets its finalizer only once it is approved, before
//! anything is applied to it; nothing is ever written to a machine nobody approved.

use std::fmt::Debug;

use kube::api::{Api, Patch, PatchParams};
use kube::{Resource, ResourceExt as _};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::Error;

/// Whether `object` holds `finalizer`.
pub fn has<K: Resource>(object: &K, finalizer: &str) -> bool {
    object.finalizers().iter().any(|f| f == finalizer)
}

/// `finalizers` with `finalizer` added (`None`: it is there already).
pub fn with(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    let mut all = finalizers.to_vec();
    all.push(finalizer.to_owned());
    Some(all)
}

/// `finalizers` with `finalizer` removed (`None`: it was not there).
pub fn without(finalizers: &[String], finalizer: &str) -> Option<Vec<String>> {
    if !finalizers.iter().any(|f| f == finalizer) {
        return None;
    }
    Some(
        finalizers
            .iter()
            .filter(|f| f.as_str() != finalizer)
            .cloned()
            .collect(),
    )
}

/// Adds `finalizer` to `object` (read fresh if the copy is stale; a gone object is left alone).
pub async fn add<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    if has(object, finalizer) {
        return Ok(());
    }
    update(api, object, |current| with(current, finalizer)).await
}

/// Removes `finalizer` from `object` (read fresh if the copy is stale; a gone object is left
/// alone).
pub async fn remove<K>(api: &Api<K>, object: &K, finalizer: &str) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    update(api, object, |current| without(current, finalizer)).await
}

async fn update<K>(
    api: &Api<K>,
    object: &K,
    change: impl Fn(&[String]) -> Option<Vec<String>>,
) -> Result<(), Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    // The copy in hand first (a watch's cache), its `resourceVersion` the patch's precondition:
    // a copy that lags a write made since (this manager's own status writes among them) makes
    // the patch conflict, and the object is read fresh and patched again.
    if object.resource_version().is_some() {
        match patch(api, object, &change).await {
            Err(kube::Error::Api(status)) if status.is_conflict() => {}
            Err(kube::Error::Api(status)) if status.is_not_found() => return Ok(()),
            done => return Ok(done?),
        }
    }
    let Some(fresh) = api.get_opt(&object.name_any()).await? else {
        return Ok(());
    };
    Ok(patch(api, &fresh, &change).await?)
}

/// Writes `change` of `object`'s finalizers (if any) with `object`'s `resourceVersion`.
async fn patch<K>(
    api: &Api<K>,
    object: &K,
    change: &impl Fn(&[String]) -> Option<Vec<String>>,
) -> Result<(), kube::Error>
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let Some(finalizers) = change(object.finalizers()) else {
        return Ok(());
    };
    let patch = json!({"metadata": {
        "finalizers": finalizers,
        "resourceVersion": object.resource_version(),
    }});
    api.patch(
        &object.name_any(),
        &PatchParams::default(),
        &Patch::Merge(patch),
    )
    .await?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adding_and_removing_keep_the_other_finalizers() {
        let theirs = vec!["example.com/other".to_owned()];
        let added = with(&theirs, "ichor.maesh.dev/x").expect("added");
        assert_eq!(added, ["example.com/other", "ichor.maesh.dev/x"]);
        assert_eq!(with(&added, "ichor.maesh.dev/x"), None, "already there");
        assert_eq!(
            without(&added, "ichor.maesh.dev/x").expect("removed"),
            theirs
        );
        assert_eq!(without(&theirs, "ichor.maesh.dev/x"), None, "not there");
    }
}
