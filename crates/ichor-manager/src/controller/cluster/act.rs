//! What the cluster reconciler does and records: its status groups written, its finalizer,
//! the bundle ensured, the conditions it sets (`SecretsReady`, `Transitioning`,
//! `CredentialsPublished`, `Bootstrapped`, `ConfigRolledOut`, `Ready`, `NodeIdentityVerified`),
//! the credentials files minted and published, the bootstrap called and recorded, tombstoned
//! nodes reset; each with its Event. Nothing here decides: the flow is `mod.rs`'s, the
//! decisions `plan`'s.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_api::TalosMachine;
use ichor_api::cluster::{
    BootstrapRecord, ClusterCore, ClusterRestore, ClusterTombstones, TalosClusterStatus, Tombstone,
};
use ichor_api::names::{actions, conditions, finalizers, reasons};
use ichor_render::credentials::Minted;
use ichor_talos::{Bootstrapped, TalosClient, TalosError};
use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::events::EventType;

use super::manifests::Synced;
use super::plan::{self, File, Held, Tally};
use crate::infra::status::{self, Guard};
use crate::renewal::{self, Why};
use crate::{Context, Error, infra::conditions as cond, secrets};
use crate::{accepted, kubernetes_steps};

/// Writes the groups this reconciler owns: the cluster's core and its restore.
pub(super) async fn write_status(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &TalosClusterStatus,
) -> Result<(), Error> {
    // `lock`, `tombstones`, `driftHalt` and `backup` are other groups with their own writers
    // (`lock`, `controller::machine::removal`, `drift`, `controller::backup`): this one writes
    // only its own, and the restore's (`restore` runs within this reconciler).
    let api = Api::<TalosCluster>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    status::apply::<ClusterCore, _>(&api, cluster, status, Guard::None).await?;
    status::apply::<ClusterRestore, _>(&api, cluster, status, Guard::None).await?;
    Ok(())
}

/// The TalosClusters of `cluster`'s namespace.
pub(super) fn clusters_api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

/// Holds `cluster` with the removal finalizer until its machines are removed (a deleted
/// cluster is torn down).
pub(super) async fn add_finalizer(ctx: &Context, cluster: &TalosCluster) -> Result<(), Error> {
    crate::infra::finalizer::add(
        &clusters_api(ctx, cluster),
        cluster,
        finalizers::CLUSTER_REMOVAL,
    )
    .await
}

/// `SecretsReady` False with the problem's reason; a Warning Event when the bundle turns lost
/// or mismatched (once, when the reason changes).
async fn record_bundle_unavailable(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    problem: &secrets::BundleUnavailable,
) {
    let stop = crate::Stop::new(problem.reason(), problem.to_string());
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::SECRETS_READY)
        .map(|c| c.reason.clone());
    stop.set_condition(
        &mut status.conditions,
        conditions::SECRETS_READY,
        cluster.metadata.generation,
        &ctx.now(),
    );
    if stop.reason != reasons::SECRETS_BUNDLE_UNAVAILABLE && before.as_deref() != Some(stop.reason)
    {
        stop.warn(ctx, cluster, actions::RECONCILE).await;
    }
}

/// The cluster's secrets bundle, recorded in `SecretsReady` (and its fingerprint and Secret in
/// status); `None` while it is unavailable.
pub(super) async fn ensure_bundle(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
) -> Result<Option<ichor_render::SecretsBundle>, Error> {
    // Secrets: generated only while no machine was ever configured and no node at the
    // cluster's addresses runs configured; lost, never regenerated, after (ichor-deleteguard's
    // bundle_step, ADR 0053).
    let configured = machines.iter().any(plan::ever_configured);
    let addresses = secrets::node_addresses(cluster, machines);
    let look = (&addresses[..], ctx.settings.sweep);
    match secrets::ensure(ctx, cluster, configured, look).await? {
        Ok(b) => {
            status
                .core
                .bundle_fingerprint
                .get_or_insert_with(|| secrets::fingerprint(&b));
            cond::set(
                &mut status.conditions,
                conditions::SECRETS_READY,
                true,
                reasons::BUNDLE_VALID,
                "the secrets bundle is present and valid",
                cluster.metadata.generation,
                &ctx.now(),
            );
            status.core.secrets_secret = Some(secrets::bundle_secret_name(cluster));
            Ok(Some(b))
        }
        Err(problem) => {
            record_bundle_unavailable(ctx, cluster, status, &problem).await;
            Ok(None)
        }
    }
}

/// The machine counts in status and the `Transitioning` condition they imply.
pub(super) fn record_counts(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    tally: &Tally,
) {
    status.core.control_planes = Some(tally.control_planes());
    status.core.workers = Some(tally.workers());
    // Transitioning is a fact, not an error.
    let (transitioning, reason, message) = tally.transitioning();
    cond::set(
        &mut status.conditions,
        conditions::TRANSITIONING,
        transitioning,
        reason,
        message,
        cluster.metadata.generation,
        &ctx.now(),
    );
}

/// Records a published file's Secret and expiry in status, and returns when it is due for
/// renewal; a file not published (its name held by another Secret, which is not Ichor's) has
/// neither.
pub(super) fn record_file(
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    file: File,
    published: Result<Held, secrets::NameTaken>,
) -> Result<Timestamp, secrets::NameTaken> {
    let expiries = status.core.credentials.get_or_insert_with(Default::default);
    let (secret, expires, name) = match file {
        File::Talosconfig => (
            &mut status.core.talosconfig_secret,
            &mut expiries.talosconfig_expires_at,
            plan::talosconfig_name(cluster),
        ),
        File::Kubeconfig => (
            &mut status.core.kubeconfig_secret,
            &mut expiries.kubeconfig_expires_at,
            plan::kubeconfig_name(cluster),
        ),
    };
    let held = published.as_ref().ok();
    *secret = held.map(|_| name);
    *expires = held.map(|h| Time(h.expires));
    published.map(|h| h.renew_at)
}

/// `CredentialsPublished`: true once nothing published is held by another Secret, else false
/// naming each such Secret, with a Warning Event when one is first found (ADR 0053).
pub(super) async fn record_published(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    taken: &[secrets::NameTaken],
) {
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::CREDENTIALS_PUBLISHED)
        .map(|c| (c.reason.clone(), c.message.clone()));
    let (published, reason, message) = secrets::published_condition(taken);
    cond::set(
        &mut status.conditions,
        conditions::CREDENTIALS_PUBLISHED,
        published,
        reason,
        message.clone(),
        cluster.metadata.generation,
        &ctx.now(),
    );
    if !published && before != Some((reason.to_owned(), message.clone())) {
        ctx.event(
            cluster,
            EventType::Warning,
            reason,
            actions::PUBLISH,
            message,
        )
        .await;
    }
}

/// Mints the file under `key` of Secret `name` anew with `mint` (valid for the configured
/// lifetime) and publishes it, with an Event saying `why` unless it was missing; nothing is
/// written when another Secret holds the name ([`secrets::NameTaken`]).
pub(super) async fn mint_file(
    ctx: &Context,
    cluster: &TalosCluster,
    (name, key, what): (&str, &str, &'static str),
    why: Why,
    mint: impl FnOnce(Duration) -> Result<Minted, ichor_render::pki::PkiError>,
) -> Result<Result<Held, secrets::NameTaken>, Error> {
    let lifetime = ctx.settings.credential_lifetime;
    let minted = mint(lifetime).map_err(|source| Error::Mint { what, source })?;
    let data = BTreeMap::from([(key.to_owned(), ByteString(minted.file.0.into_bytes()))]);
    let labels = secrets::cluster_labels(cluster);
    if let Err(taken) = secrets::publish(ctx, cluster, (name, what), labels, data).await? {
        return Ok(Err(taken));
    }
    let expires = Timestamp::try_from(minted.expires)
        .map_err(|e| Error::Invariant(format!("{what} expires out of range: {e}")))?;
    if let Some(reason) = why.event_reason() {
        let note = format!("{what} in Secret {name} minted anew ({why}); it expires at {expires}");
        ctx.event(cluster, EventType::Normal, reason, actions::PUBLISH, note)
            .await;
    }
    let renew_at = renewal::due_after_mint(expires, lifetime);
    Ok(Ok(Held { expires, renew_at }))
}

/// `ConfigRolledOut`, `VersionRolledOut` (with `status.rollout`) and `Ready` on the cluster.
pub(super) fn record_readiness(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    tally: &Tally,
    synced: Option<&Synced>,
) {
    let generation = cluster.metadata.generation;
    let (current, reason, message) = crate::drift::rolled_out(
        cluster.status.as_ref().and_then(|s| s.drift.halt.as_ref()),
        machines,
    );
    cond::set(
        &mut status.conditions,
        conditions::CONFIG_ROLLED_OUT,
        current,
        reason,
        message,
        generation,
        &ctx.now(),
    );
    let (current, reason, message) = record_versions(cluster, status, machines, current, synced);
    cond::set(
        &mut status.conditions,
        conditions::VERSION_ROLLED_OUT,
        current,
        reason,
        message,
        generation,
        &ctx.now(),
    );
    let all_ready = tally.all_ready(cond::is_true(&status.conditions, conditions::BOOTSTRAPPED));
    cond::set(
        &mut status.conditions,
        conditions::READY,
        all_ready,
        if all_ready {
            reasons::ALL_MACHINES_READY
        } else {
            reasons::MACHINES_NOT_READY
        },
        tally.ready_message(),
        generation,
        &ctx.now(),
    );
}

/// The versions the nodes are brought to (ADR 0069): the declared ones once they pass the
/// version rules, else the accepted ones kept; recorded with the rollout of the accepted Talos
/// and the step a Kubernetes rollout is at (ADR 0070). Returns `VersionRolledOut` (holds,
/// reason, message); `configs_current` is whether every machine runs its config.
fn record_versions(
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    configs_current: bool,
    synced: Option<&Synced>,
) -> (bool, &'static str, String) {
    let namespace = cluster.namespace().unwrap_or_default();
    let name = cluster.name_any();
    let members = kubernetes_steps::members(machines, &namespace, &name);
    let step = status
        .core
        .accepted_versions
        .as_ref()
        .filter(|a| a.kubernetes_from.is_some())
        .map(|a| kubernetes_steps::step(&a.kubernetes_version, &members));
    let outcome = accepted::decide(
        accepted::declared(&cluster.spec),
        status.core.accepted_versions.as_ref(),
        accepted::Running {
            oldest_talos: ichor_api::versions::oldest_running(machines, &namespace, &name)
                .map(|(_, version)| version),
            kubernetes_rolled_out: configs_current
                && match step {
                    None => true,
                    Some(kubernetes_steps::Step::Manifests) => {
                        matches!(synced, Some(Synced::Done(_)))
                    }
                    Some(_) => false,
                },
        },
    );
    status.core.accepted_versions.clone_from(&outcome.accepted);
    let rolling_out = outcome
        .accepted
        .as_ref()
        .map_or(&cluster.spec.talos_version, |a| &a.talos_version);
    // The lock as this reconcile found it, else as last mirrored.
    let last = cluster.status.as_ref().and_then(|s| s.lock.mirror.as_ref());
    let lock = status.lock.mirror.as_ref().or(last);
    let (mut rollout, condition) = crate::drift::version_rollout(rolling_out, machines, lock);
    rollout.kubernetes_step = step.map(|s| s.to_string());
    rollout.changes = super::plan::changes(&rollout, machines, outcome.accepted.as_ref());
    // A Kubernetes rollout still stepping is not rolled out, whatever Talos says.
    let condition = match (&condition, &rollout.kubernetes_step, &outcome.accepted) {
        ((true, _, _), Some(_), Some(accepted)) if let Some(Synced::Failed(why)) = synced => (
            false,
            reasons::MANIFESTS_NOT_SYNCED,
            format!(
                "Kubernetes {} runs on every node; syncing the bootstrap manifests to the workload cluster failed, tried again: {why}",
                accepted.kubernetes_version
            ),
        ),
        ((true, _, _), Some(step), Some(accepted)) => (
            false,
            reasons::VERSION_ROLLING_OUT,
            format!(
                "Kubernetes {} rolls out in talosctl upgrade-k8s's order: {step} now",
                accepted.kubernetes_version
            ),
        ),
        _ => condition,
    };
    status.core.rollout = Some(rollout);
    accepted::rollout_condition(&outcome, condition)
}

/// The Events of the versions' rollout: a refusal (ADR 0069), and the bootstrap manifests
/// synced at the end of a Kubernetes rollout (ADR 0070; a failure is in `VersionRolledOut`).
pub(super) async fn announce_versions(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &TalosClusterStatus,
    synced: Option<&Synced>,
) {
    announce_refusal(ctx, cluster, status).await;
    if let Some(Synced::Done(count)) = synced {
        ctx.event(
            cluster,
            EventType::Normal,
            reasons::MANIFESTS_SYNCED,
            actions::UPGRADE,
            format!(
                "the bootstrap manifests were synced to the workload cluster ({count} objects)"
            ),
        )
        .await;
    }
}

/// A Warning Event when the manager refuses the declared versions (ADR 0069): once, when the
/// refusal first shows or says something else.
async fn announce_refusal(ctx: &Context, cluster: &TalosCluster, status: &TalosClusterStatus) {
    let refusal = |conditions: &[ichor_api::common::Condition]| {
        conditions
            .iter()
            .find(|c| {
                c.type_ == conditions::VERSION_ROLLED_OUT
                    && c.reason == reasons::VERSION_CHANGE_REFUSED
            })
            .map(|c| c.message.clone())
    };
    let Some(now) = refusal(&status.conditions) else {
        return;
    };
    let before = cluster.status.as_ref().and_then(|s| refusal(&s.conditions));
    if before.as_ref() == Some(&now) {
        return;
    }
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::VERSION_CHANGE_REFUSED,
        actions::UPGRADE,
        now,
    )
    .await;
}

/// Sets the cluster's `Bootstrapped` condition.
pub(super) fn set_bootstrapped(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    holds: bool,
    reason: &str,
    message: impl Into<String>,
) {
    cond::set(
        &mut status.conditions,
        conditions::BOOTSTRAPPED,
        holds,
        reason,
        message,
        cluster.metadata.generation,
        &ctx.now(),
    );
}

/// Records `name` as the machine that bootstraps etcd, before any call, with an Event.
pub(super) async fn record_bootstrap_choice(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    name: String,
    uid: String,
) -> Result<(), Error> {
    // Record first, guarded by resourceVersion: a concurrent writer makes this fail
    // and the next reconcile decides again on what it wrote.
    let mut next = status.clone();
    next.core.bootstrap = Some(BootstrapRecord {
        machine_name: name.clone(),
        machine_uid: uid,
        chosen_at: ctx.now(),
        completed_at: None,
    });
    status::apply::<ClusterCore, _>(&clusters_api(ctx, cluster), cluster, &next, Guard::Version)
        .await?;
    *status = next;
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::BOOTSTRAP_CHOSEN,
        actions::BOOTSTRAP,
        format!("{name} will bootstrap etcd"),
    )
    .await;
    Ok(())
}

/// Calls Bootstrap on the node behind `client` (etcd from nothing).
pub(super) async fn bootstrap_etcd(
    ctx: &Context,
    client: &TalosClient,
) -> Result<Bootstrapped, TalosError> {
    client.bootstrap(ctx.settings.bootstrap_patience).await
}

/// Calls Bootstrap on the node behind `client` from the snapshot uploaded to it (a restore).
pub(super) async fn recover_etcd(
    ctx: &Context,
    client: &TalosClient,
) -> Result<Bootstrapped, TalosError> {
    client
        .bootstrap_recover(ctx.settings.bootstrap_patience, false)
        .await
}

/// Records the bootstrap done: the record completed, with an Event saying `message`.
pub(super) async fn record_bootstrapped(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    message: String,
) {
    if let Some(record) = status.core.bootstrap.as_mut() {
        record.completed_at.get_or_insert_with(|| ctx.now());
    }
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::BOOTSTRAPPED,
        actions::BOOTSTRAP,
        message,
    )
    .await;
}

/// Records etcd found running on `name` (`uid`): the bootstrap record (kept when there is one)
/// completed now, and `Bootstrapped` true.
pub(super) fn record_etcd_running(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    name: String,
    uid: String,
) {
    let message = format!("etcd already runs ({name} reports members)");
    status.core.bootstrap.get_or_insert(BootstrapRecord {
        machine_name: name,
        machine_uid: uid,
        chosen_at: ctx.now(),
        completed_at: Some(ctx.now()),
    });
    set_bootstrapped(ctx, cluster, status, true, reasons::ETCD_RUNNING, message);
}

/// Resets the node at tombstoned `stone` (STATE and EPHEMERAL, reboot) now that it answered
/// the cluster's credentials as the machine removed, with a Warning Event.
pub(super) async fn reset_tombstoned(
    ctx: &Context,
    cluster: &TalosCluster,
    stone: &Tombstone,
    client: &TalosClient,
) -> Result<(), Error> {
    client
        .reset(ichor_talos::ResetOptions {
            graceful: false,
            reboot: true,
        })
        .await
        .map_err(|e| Error::talos(format!("resetting tombstoned {}", stone.address), e))?;
    ctx.event(
        cluster,
        EventType::Warning,
        reasons::TOMBSTONE_RESET,
        actions::RESET,
        format!(
            "{} ({}), force-removed while unreachable, answered again: reset to maintenance before it could rejoin",
            stone.address, stone.machine
        ),
    )
    .await;
    Ok(())
}

/// `NodeIdentityVerified` False while nodes at tombstoned addresses are refused (a Warning
/// Event when what is refused changes), absent otherwise.
pub(super) async fn record_identity(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    refused: &[ichor_deleteguard::IdentityRefusal],
) {
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::NODE_IDENTITY_VERIFIED)
        .map(|c| c.message.clone());
    let Some(first) = refused.first() else {
        status
            .conditions
            .retain(|c| c.type_ != conditions::NODE_IDENTITY_VERIFIED);
        return;
    };
    let message = refused
        .iter()
        .map(ichor_deleteguard::IdentityRefusal::message)
        .collect::<Vec<_>>()
        .join("; ");
    let stop = crate::Stop::new(first.reason(), message);
    stop.set_condition(
        &mut status.conditions,
        conditions::NODE_IDENTITY_VERIFIED,
        cluster.metadata.generation,
        &ctx.now(),
    );
    if before.as_deref() != Some(stop.message.as_str()) {
        stop.warn(ctx, cluster, actions::RESET).await;
    }
}

/// Takes the cleared `stone` out of the cluster's freshly read tombstones.
pub(super) async fn write_tombstones(
    ctx: &Context,
    cluster: &TalosCluster,
    stone: &Tombstone,
) -> Result<(), Error> {
    let api = clusters_api(ctx, cluster);
    if let Some(fresh) = api.get_opt(&cluster.name_any()).await? {
        let left: Vec<_> = fresh
            .status
            .as_ref()
            .map(|s| s.tombstones.list.clone())
            .unwrap_or_default()
            .into_iter()
            .filter(|t| t.address != stone.address)
            .collect();
        let mut status = fresh.status.clone().unwrap_or_default();
        status.tombstones.list = left;
        status::apply::<ClusterTombstones, _>(&api, &fresh, &status, Guard::Version).await?;
    }
    Ok(())
}
