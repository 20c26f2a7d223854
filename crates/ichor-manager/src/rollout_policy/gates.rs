//! The health gates of `spec.rollout` (ADR 0075): each reads its objects from the workload
//! cluster with the manager's own credentials and hands them to `ichor_deleteguard::gates`,
//! which evaluates the gate's CEL, its cost bounded. A gate never reads a Secret: the door
//! refuses the kind, and the resource is checked again here after discovery.

use ichor_api::TalosCluster;
use ichor_api::names::reasons;
use ichor_api::rollout::HealthGate;
use ichor_deleteguard::gates::{self, Gate, MAX_OBJECTS, Verdict};
use kube::api::{Api, DynamicObject, ListParams};
use kube::core::{ApiResource, GroupVersion, GroupVersionKind, TypeMeta};
use kube::discovery::{Scope, pinned_kind};

use super::Governing;
use crate::workload::API_TIMEOUT;
use crate::{Context, Stop};

/// Why the next node waits by a health gate of the `governing` policy (the first that does
/// not pass), or `None` when every gate passes. `what` names the step, for the message.
pub(super) async fn failing(
    ctx: &Context,
    cluster: &TalosCluster,
    governing: &Governing<'_>,
    what: &str,
) -> Option<Stop> {
    let declared = &governing.policy.health_gates;
    if declared.is_empty() {
        return None;
    }
    let compiled = match compile(declared, &governing.field) {
        Ok(compiled) => compiled,
        Err(stop) => return Some(stop),
    };
    let Some(client) = crate::workload::client(ctx, cluster).await else {
        return Some(Stop::new(
            reasons::HEALTH_GATE_FAILING,
            format!(
                "{what} waits: the health gates cannot read the workload cluster (its secrets bundle is unavailable)"
            ),
        ));
    };
    for (gate, spec) in compiled.into_iter().zip(declared) {
        let verdict = match read(&client, spec).await {
            // Bounded by the gate's cost limit, yet CPU work: off the async workers.
            Ok(objects) => tokio::task::spawn_blocking(move || gates::evaluate(&gate, &objects))
                .await
                .unwrap_or_else(|e| Verdict::Fail(format!("its evaluation did not finish: {e}"))),
            Err(problem) => Verdict::Fail(problem),
        };
        if let Verdict::Fail(saw) = verdict {
            return Some(Stop::new(
                reasons::HEALTH_GATE_FAILING,
                format!(
                    "{what} waits: health gate {} ({} {}) fails: {saw}",
                    spec.name,
                    spec.kind,
                    scope(spec)
                ),
            ));
        }
    }
    None
}

/// Every gate compiled; the first that does not names its field.
fn compile(declared: &[HealthGate], field: &str) -> Result<Vec<Gate>, Stop> {
    declared
        .iter()
        .enumerate()
        .map(|(i, g)| {
            Gate::compile(&g.name, &g.expression).map_err(|problem| {
                Stop::new(
                    reasons::ROLLOUT_POLICY_INVALID,
                    format!(
                        "{field}.healthGates[{i}].expression: {problem}; every step a gate holds waits until it compiles"
                    ),
                )
            })
        })
        .collect()
}

/// Where a gate reads, for a message.
fn scope(gate: &HealthGate) -> String {
    let place = gate
        .namespace
        .as_deref()
        .map_or_else(|| "in every namespace".to_owned(), |ns| format!("in {ns}"));
    match gate.label_selector.as_deref() {
        Some(selector) => format!("{place} with {selector}"),
        None => place,
    }
}

/// The group, version and kind a gate reads (`v1` is the core group), as kube reads an
/// `apiVersion`.
fn gvk(gate: &HealthGate) -> Result<GroupVersionKind, String> {
    gate.api_version
        .parse::<GroupVersion>()
        .map(|gv| gv.with_kind(&gate.kind))
        .map_err(|e| format!("apiVersion {:?} does not read: {e}", gate.api_version))
}

/// The gate's objects as JSON, each with its kind and without its managed fields; an error
/// says why they cannot be read.
async fn read(client: &kube::Client, gate: &HealthGate) -> Result<Vec<serde_json::Value>, String> {
    let (api, resource) = api_of(client, gate).await?;
    let mut params =
        ListParams::default().limit(u32::try_from(MAX_OBJECTS + 1).unwrap_or(u32::MAX));
    if let Some(selector) = gate.label_selector.as_deref() {
        params = params.labels(selector);
    }
    let list = match tokio::time::timeout(API_TIMEOUT, api.list(&params)).await {
        Ok(Ok(list)) => list,
        Ok(Err(error)) => return Err(format!("the workload cluster's list failed: {error}")),
        Err(_) => return Err(unanswered(API_TIMEOUT)),
    };
    let more = list
        .metadata
        .continue_
        .as_deref()
        .is_some_and(|c| !c.is_empty());
    if more {
        return Err(format!(
            "more than {MAX_OBJECTS} objects match; narrow the gate with a namespace or a label selector"
        ));
    }
    let types = TypeMeta {
        api_version: resource.api_version.clone(),
        kind: resource.kind.clone(),
    };
    Ok(list
        .items
        .into_iter()
        .map(|mut object| {
            object.types = Some(types.clone());
            object.metadata.managed_fields = None;
            serde_json::to_value(object).unwrap_or(serde_json::Value::Null)
        })
        .collect())
}

/// The API of the gate's kind, where it reads, as the workload cluster's discovery says; never
/// the core group's Secrets, whatever the kind was spelled.
async fn api_of(
    client: &kube::Client,
    gate: &HealthGate,
) -> Result<(Api<DynamicObject>, ApiResource), String> {
    let gvk = gvk(gate)?;
    let (resource, caps) = match tokio::time::timeout(API_TIMEOUT, pinned_kind(client, &gvk)).await
    {
        Ok(Ok(found)) => found,
        Ok(Err(error)) => {
            return Err(format!(
                "the workload cluster does not serve {} {}: {error}",
                gate.api_version, gate.kind
            ));
        }
        Err(_) => return Err(unanswered(API_TIMEOUT)),
    };
    if resource.group.is_empty() && resource.plural == "secrets" {
        return Err("a health gate never reads a Secret".to_owned());
    }
    let api = match (&caps.scope, gate.namespace.as_deref()) {
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced | Scope::Cluster, None) => Api::all_with(client.clone(), &resource),
        (Scope::Cluster, Some(_)) => {
            return Err(format!(
                "{} is cluster-scoped: unset the gate's namespace",
                gate.kind
            ));
        }
    };
    Ok((api, resource))
}

/// A workload API call that took longer than `limit`.
fn unanswered(limit: std::time::Duration) -> String {
    format!(
        "the workload cluster's API did not answer within {}s",
        limit.as_secs()
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_core_group_is_the_empty_one() {
        let group_version = |api_version: &str| {
            let gate = HealthGate {
                name: "g".into(),
                api_version: api_version.into(),
                kind: "K".into(),
                namespace: None,
                label_selector: None,
                expression: "true".into(),
            };
            let gvk = gvk(&gate).expect("reads");
            (gvk.group, gvk.version)
        };
        let pair = |g: &str, v: &str| (g.to_owned(), v.to_owned());
        assert_eq!(group_version("v1"), pair("", "v1"));
        assert_eq!(group_version("apps/v1"), pair("apps", "v1"));
        assert_eq!(group_version("ceph.rook.io/v1"), pair("ceph.rook.io", "v1"));
    }

    #[test]
    fn a_gates_scope_reads_as_written() {
        let gate = HealthGate {
            name: "apps".into(),
            api_version: "apps/v1".into(),
            kind: "Deployment".into(),
            namespace: Some("shop".into()),
            label_selector: Some("tier=web".into()),
            expression: "true".into(),
        };
        assert_eq!(scope(&gate), "in shop with tier=web");
        let everywhere = HealthGate {
            namespace: None,
            label_selector: None,
            ..gate
        };
        assert_eq!(scope(&everywhere), "in every namespace");
    }
}
