//! An `AdmissionReview` body, parsed as the webhook parses it, and the guard's decisions on it:
//! the objects decoded into Ichor's types and run through `ichor-deleteguard`'s rules, as
//! `ichor_webhook::guard::Guard::decide` does, with the live state the guard would read taken
//! from the body's extra `live` field (`{"cluster": TalosCluster, "machines": [TalosMachine]}`).
//!
//! Invariants: nothing panics; the same input gets the same decision; a refusal has a
//! CamelCase reason and a message; the answer, built as the server builds it, serializes into
//! a review that parses back with the same verdict; an update that changes nothing is never
//! refused; the control-plane count never grows by a removal.
#![no_main]

use ichor_api::decode::decode;
use ichor_api::operation::{OperationAction, TalosOperation};
use ichor_api::reservation::reservations;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_deleteguard::{
    Cluster, Disruption, Machine, Refusal, annotation_true, check_cluster_delete,
    check_machine_delete, check_machine_update, check_targets, control_plane_counts,
};
use kube::core::DynamicObject;
use kube::core::admission::{AdmissionRequest, AdmissionResponse, AdmissionReview, Operation};
use libfuzzer_sys::fuzz_target;
use serde::Deserialize;

/// What the guard would read from the apiserver.
#[derive(Default, Deserialize)]
#[serde(default)]
struct Live {
    cluster: Option<TalosCluster>,
    machines: Vec<TalosMachine>,
    now: i64,
}

#[derive(Deserialize)]
struct Body {
    #[serde(default)]
    live: Option<Live>,
}

/// The decision's outcome: `None` when the request does not decode (the guard refuses it as
/// unreadable live state). Objects decode with `ichor_api::decode::decode`, the guard's own.
type Outcome = Option<Result<(), Refusal>>;

/// The machines as the rules see them: a standing reservation marks a removal under way.
fn inputs(live: &Live) -> Vec<Machine> {
    let reserved = live.cluster.as_ref().map(reservations).unwrap_or_default();
    live.machines
        .iter()
        .map(|m| {
            let mut input = Machine::from(m);
            if reserved
                .iter()
                .any(|r| Some(r.uid.as_str()) == m.metadata.uid.as_deref())
            {
                input.deleting = true;
            }
            input
        })
        .collect()
}

fn cluster_view(live: &Live, name: &str, namespace: &str) -> Cluster {
    live.cluster
        .as_ref()
        .map_or_else(
            || {
                Cluster::new(name.to_owned(), 0)
                    .in_namespace(namespace.to_owned())
                    .being_deleted()
            },
            Cluster::from,
        )
        .at(live.now)
}

fn machine_delete(request: &AdmissionRequest<DynamicObject>, live: &Live) -> Outcome {
    let target: TalosMachine = decode(request.old_object.clone()?).ok()?;
    let namespace = target.metadata.namespace.clone().unwrap_or_default();
    let me = Machine::from(&target);
    let machines = inputs(live);
    let counts = control_plane_counts(&me, &machines);
    assert!(counts.after <= counts.before, "a removal grew the count");
    assert!(
        counts.before - counts.after <= 1,
        "a removal took more than one"
    );
    let view = cluster_view(live, &target.spec.cluster_ref.name, &namespace);
    Some(check_machine_delete(&me, &machines, &view))
}

fn operation_create(request: &AdmissionRequest<DynamicObject>, live: &Live) -> Outcome {
    let operation: TalosOperation = decode(request.object.clone()?).ok()?;
    let disruption = match operation.spec.action {
        OperationAction::Reset => Disruption::Reset {
            operation: operation.metadata.name.clone().unwrap_or_default(),
            allow_delete: annotation_true(
                operation.metadata.annotations.as_ref(),
                ichor_api::names::annotations::ALLOW_DELETE,
            ),
        },
        OperationAction::Reboot | OperationAction::Upgrade => Disruption::Restart,
        _ => return Some(Ok(())),
    };
    let Some(cluster) = &live.cluster else {
        return Some(Ok(()));
    };
    let Ok(targets) = operation.spec.targets(&live.machines) else {
        return Some(Ok(()));
    };
    let names: Vec<&str> = targets.iter().map(String::as_str).collect();
    let machines: Vec<Machine> = live.machines.iter().map(Machine::from).collect();
    let view = Cluster::from(cluster).at(live.now);
    Some(check_targets(&names, &machines, &view, &disruption))
}

fn decide(request: &AdmissionRequest<DynamicObject>, live: &Live) -> Outcome {
    match (request.kind.kind.as_str(), &request.operation) {
        ("TalosMachine", Operation::Delete) => machine_delete(request, live),
        ("TalosMachine", Operation::Update) => {
            let old: TalosMachine = decode(request.old_object.clone()?).ok()?;
            let new: TalosMachine = decode(request.object.clone()?).ok()?;
            let (old, new) = (Machine::from(&old), Machine::from(&new));
            assert!(
                check_machine_update(&old, &old).is_ok()
                    && check_machine_update(&new, &new).is_ok(),
                "an update that changes nothing was refused"
            );
            Some(check_machine_update(&old, &new))
        }
        ("TalosOperation", Operation::Create) => operation_create(request, live),
        ("TalosCluster", Operation::Delete) => {
            let cluster: TalosCluster = decode(request.old_object.clone()?).ok()?;
            Some(check_cluster_delete(&Cluster::from(&cluster)))
        }
        _ => Some(Ok(())),
    }
}

/// The answer as `ichor_webhook::server` builds it, through its JSON and back.
fn answer(request: &AdmissionRequest<DynamicObject>, outcome: &Outcome) {
    let response = AdmissionResponse::from(request);
    let (response, allowed) = match outcome {
        Some(Ok(())) => (response, true),
        Some(Err(refusal)) => {
            let reason = refusal.reason();
            let message = refusal.message();
            assert!(
                reason.starts_with(|c: char| c.is_ascii_uppercase())
                    && reason.chars().all(|c| c.is_ascii_alphanumeric()),
                "reason {reason:?} is not CamelCase"
            );
            assert!(
                !message.trim().is_empty(),
                "refusal {reason} has no message"
            );
            let mut denied = response.deny(message);
            denied.result.reason = reason.to_owned();
            denied.result.code = 403;
            (denied, false)
        }
        None => (response.deny("unreadable"), false),
    };
    let json = serde_json::to_vec(&response.into_review()).expect("a review serializes");
    let back: AdmissionReview<DynamicObject> =
        serde_json::from_slice(&json).expect("our review parses back");
    let back = back.response.expect("our review has a response");
    assert_eq!(back.allowed, allowed);
    assert_eq!(back.uid, request.uid);
}

fuzz_target!(|data: &[u8]| {
    let Ok(review) = serde_json::from_slice::<AdmissionReview<DynamicObject>>(data) else {
        return;
    };
    let Ok(request): Result<AdmissionRequest<DynamicObject>, _> = review.try_into() else {
        return;
    };
    let live = serde_json::from_slice::<Body>(data)
        .ok()
        .and_then(|b| b.live)
        .unwrap_or_default();
    let outcome = decide(&request, &live);
    assert_eq!(
        format!("{outcome:?}"),
        format!("{:?}", decide(&request, &live)),
        "the same request got two decisions"
    );
    answer(&request, &outcome);
});
