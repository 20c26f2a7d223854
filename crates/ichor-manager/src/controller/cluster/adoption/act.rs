//! What adoption records, once [`super::plan::judge`] decided: each adopted machine (approved,
//! pinned, annotated as adopted, its claim taken), the adoption and the bootstrap done before
//! it in the cluster's status, or the refusal on `Adopted`; each with its Event. Nothing is
//! ever written to a node.

use std::collections::BTreeMap;

use ichor_api::cluster::{AdoptionStatus, BootstrapRecord, TalosClusterStatus};
use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, TalosMachineSpec};
use ichor_api::names::{actions, annotations, conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;

use super::plan::Refusal;
use crate::{Context, Error, infra::conditions as cond};

/// Records the adoption done: the machines, the bootstrap (done before adoption), `Adopted` and
/// `Bootstrapped` true, and an Event.
pub(super) async fn record_adoption(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    names: Vec<String>,
    first: String,
    endpoints: &[String],
) {
    let now = ctx.now();
    status.core.bootstrap = Some(BootstrapRecord {
        machine_name: first,
        machine_uid: String::new(),
        chosen_at: now.clone(),
        completed_at: Some(now.clone()),
    });
    let message = format!(
        "adopted {} nodes ({}), nothing applied; etcd was bootstrapped before adoption",
        names.len(),
        endpoints.join(", ")
    );
    status.core.adoption = Some(AdoptionStatus {
        adopted_at: now.clone(),
        machines: names,
    });
    let generation = cluster.metadata.generation;
    for type_ in [conditions::BOOTSTRAPPED, conditions::ADOPTED] {
        cond::set(
            &mut status.conditions,
            type_,
            true,
            reasons::ADOPTED,
            message.clone(),
            generation,
            &now,
        );
    }
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::ADOPTED,
        actions::RECONCILE,
        message,
    )
    .await;
}

/// Records the refusal on `Adopted`, with a Warning Event when it is new.
pub(super) async fn record_refusal(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    refusal: &Refusal,
) -> Result<(), Error> {
    let stop = refusal.stop();
    let known = status.conditions.iter().any(|c| {
        c.type_ == conditions::ADOPTED && c.reason == stop.reason && c.message == stop.message
    });
    stop.set_condition(
        &mut status.conditions,
        conditions::ADOPTED,
        cluster.metadata.generation,
        &ctx.now(),
    );
    if !known {
        stop.warn(ctx, cluster, actions::RECONCILE).await;
    }
    Ok(())
}

/// Records one adopted node: approved, with its role, address and configured-mode pin, named
/// and labelled as discovery names machines. An existing record (a retry) is kept.
pub(super) async fn record_machine(
    ctx: &Context,
    cluster: &TalosCluster,
    address: &str,
    role: Role,
    fingerprint: &str,
    uuid: &str,
) -> Result<String, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = crate::controller::cluster::discovery::machine_name(uuid);
    let mut spec = TalosMachineSpec::pending(&cluster.name_any(), address, fingerprint);
    spec.approval_state = ApprovalState::Approved;
    spec.role = Some(role);
    let mut machine = TalosMachine::discovered(&namespace, &name, uuid, spec);
    machine
        .labels_mut()
        .insert(labels::ROLE.to_owned(), role.as_str().to_owned());
    machine.metadata.annotations = Some(BTreeMap::from([(
        annotations::ADOPTED.to_owned(),
        annotations::TRUE.to_owned(),
    )]));
    let machines = Api::<TalosMachine>::namespaced(ctx.client.clone(), &namespace);
    let recorded = match machines.create(&PostParams::default(), &machine).await {
        Ok(created) => created,
        Err(kube::Error::Api(s)) if s.is_already_exists() => match machines.get_opt(&name).await? {
            Some(existing) => existing,
            None => return Ok(name),
        },
        Err(e) => return Err(e.into()),
    };
    // The namespace that adopts a node holds it, as one that discovers a node does (ADR 0054):
    // the UUID was read over the cluster's mutual TLS, so only a holder of its credentials
    // could have asked. A claim held elsewhere is said, and changes nothing here: no other
    // namespace reaches a configured node without this cluster's credentials.
    if let Err(refused) =
        crate::claims::take(&ctx.client, &recorded, uuid, fingerprint, address).await?
    {
        refused.warn(ctx, &recorded, actions::RECONCILE).await;
    }
    Ok(name)
}
