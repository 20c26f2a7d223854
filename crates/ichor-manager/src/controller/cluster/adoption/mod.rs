//! Adopting a running Talos cluster (`spec.adopt`), the acting part: each endpoint is probed
//! for its configured-mode certificate, reached with the bundle's credentials, and its live
//! config, version and hardware UUID read; [`plan::judge`] decides; only then are the
//! machines recorded (approved, pinned by that certificate, annotated as adopted), with the
//! cluster's bootstrap recorded done. Nothing is ever written to a node. The machine
//! reconciler records each adopted machine's live config as its applied baseline.

pub mod plan;

use std::collections::BTreeMap;

use ichor_api::cluster::{AdoptionStatus, BootstrapRecord, TalosClusterStatus};
use ichor_api::common::Role;
use ichor_api::machine::{ApprovalState, TalosMachineSpec};
use ichor_api::names::{actions, annotations, conditions, labels, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_talos::TalosClient;
use ichor_talos::discovery::ProbeOutcome;
use kube::ResourceExt as _;
use kube::api::{Api, PostParams};
use kube::runtime::events::EventType;

use crate::{Context, Error, infra::conditions as cond};
use plan::{LiveFacts, Observed, Refusal, Unread, judge};

/// What one node answered.
struct Seen {
    observed: Observed,
    fingerprint: String,
    uuid: String,
}

/// The certificate fingerprint of a configured Talos node at `address`, or why it is not one.
async fn configured_fingerprint(ctx: &Context, address: &str) -> Result<String, Unread> {
    let Ok(ip) = address.parse::<std::net::Ipv4Addr>() else {
        return Err(Unread::NotIpv4);
    };
    // One probe, with patience: a sweep's short timeout is for many silent addresses.
    let sweep = ichor_talos::discovery::SweepConfig {
        timeout: ctx
            .settings
            .sweep
            .timeout
            .max(std::time::Duration::from_secs(5)),
        ..ctx.settings.sweep
    };
    match ichor_talos::discovery::probe(ip, sweep).await {
        Some(ProbeOutcome::Configured { fingerprint }) => Ok(fingerprint),
        Some(ProbeOutcome::Maintenance(_)) => Err(Unread::InMaintenance),
        Some(_) | None => Err(Unread::Silent),
    }
}

/// Probes `address` and reads what adoption needs, or says why it cannot.
async fn see(ctx: &Context, address: &str, credentials: &ichor_talos::Credentials) -> Seen {
    let failed = |why: Unread| Seen {
        observed: Observed {
            address: address.to_owned(),
            answer: Err(why),
            untrusted: None,
        },
        fingerprint: String::new(),
        uuid: String::new(),
    };
    // A node that answered the probe but refuses the bundle's credentials (or whose
    // certificate the bundle's CA does not verify) belongs to another CA.
    let untrusted = |why: Unread, fingerprint: &str| Seen {
        observed: Observed {
            address: address.to_owned(),
            answer: Err(why),
            untrusted: Some(fingerprint.to_owned()),
        },
        fingerprint: fingerprint.to_owned(),
        uuid: String::new(),
    };
    let fingerprint = match configured_fingerprint(ctx, address).await {
        Ok(fingerprint) => fingerprint,
        Err(why) => return failed(why),
    };
    let endpoint = format!("{address}:{}", ctx.settings.sweep.port);
    let client = match TalosClient::connect(&endpoint, credentials).await {
        Ok(client) => client,
        Err(err) => return untrusted(Unread::Failed(err.to_string()), &fingerprint),
    };
    let failed_call = |err: ichor_talos::TalosError| Unread::Failed(err.to_string());
    let read = async {
        let config = client.live_config().await.map_err(failed_call)?;
        let facts = LiveFacts::read(&config)?;
        let version = client.version().await.map_err(failed_call)?;
        let uuid = client.inventory().await.map_err(failed_call)?.uuid;
        Ok::<_, Unread>((facts, version, uuid))
    };
    match read.await {
        Ok((facts, version, uuid)) => Seen {
            observed: Observed {
                address: address.to_owned(),
                answer: Ok((facts, version)),
                untrusted: None,
            },
            fingerprint,
            uuid,
        },
        Err(why) if tls_refused(&why.to_string()) => untrusted(why, &fingerprint),
        Err(why) => failed(Unread::Unreadable(Box::new(why))),
    }
}

/// Whether a failure reads as a TLS refusal: a certificate one side does not trust.
fn tls_refused(why: &str) -> bool {
    let lower = why.to_ascii_lowercase();
    [
        "certificate",
        "tls",
        "handshake",
        "unknown ca",
        "unknownissuer",
    ]
    .iter()
    .any(|sign| lower.contains(sign))
}

/// Adopts the cluster's nodes when it asks and has not yet: all of them, or none (a refusal on
/// `Adopted`, with an Event).
pub async fn adopt(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    bundle: &ichor_render::SecretsBundle,
) -> Result<(), Error> {
    let Some(spec) = cluster.spec.adopt.as_ref() else {
        return Ok(());
    };
    if status.core.adoption.is_some() {
        return Ok(());
    }
    // A namespace confined to address ranges adopts, and so claims, only nodes inside them.
    let namespace = cluster.namespace().unwrap_or_default();
    if let Some(policy) = crate::claims::policy(&ctx.client, &namespace).await? {
        let refused = spec
            .endpoints
            .iter()
            .find_map(|address| crate::claims::refused_address(&policy, &namespace, address));
        if let Some(refused) = refused {
            return refuse(
                ctx,
                cluster,
                status,
                &Refusal::AddressNotAllowed(refused.message),
            )
            .await;
        }
    }
    let credentials = ctx.node_credentials(cluster, bundle)?;
    let mut seen = Vec::new();
    for address in &spec.endpoints {
        seen.push(see(ctx, address, &credentials).await);
    }
    let observed: Vec<Observed> = seen.iter().map(|s| s.observed.clone()).collect();
    let fingerprint = crate::secrets::fingerprint(bundle);
    let adoptable = match judge(&cluster.spec, &fingerprint, &observed) {
        Ok(adoptable) => adoptable,
        Err(refusal) => return refuse(ctx, cluster, status, &refusal).await,
    };
    let mut names = Vec::new();
    for (s, (address, control_plane)) in seen.iter().zip(&adoptable.nodes) {
        let role = if *control_plane {
            Role::ControlPlane
        } else {
            Role::Worker
        };
        names.push(record_machine(ctx, cluster, address, role, &s.fingerprint, &s.uuid).await?);
    }
    let first = adoptable
        .nodes
        .iter()
        .position(|(_, cp)| *cp)
        .and_then(|i| names.get(i))
        .cloned()
        .unwrap_or_default();
    recorded(ctx, cluster, status, names, first, &spec.endpoints).await;
    Ok(())
}

/// Records the adoption done: the machines, the bootstrap (done before adoption), `Adopted` and
/// `Bootstrapped` true, and an Event.
async fn recorded(
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

async fn refuse(
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
async fn record_machine(
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
