//! The cluster reconciler: secrets, discovery, bootstrap exactly once, published credentials,
//! and the cluster's status aggregated from its machines.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use ichor_api::backup::RestoreStatus;
use ichor_api::cluster::{
    BootstrapRecord, ClusterCore, ClusterRestore, ClusterTombstones, TalosClusterStatus, Tombstone,
};
use ichor_api::machine::MachinePhase;
use ichor_api::names::controllers;
use ichor_api::names::{actions, conditions, finalizers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::credentials::{self, Minted, Published};
use ichor_talos::TalosClient;
use k8s_openapi::ByteString;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::EventType;
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::infra::shared::Changes;
use crate::infra::status::{self, Guard};
use crate::renewal::{self, Renewal, Validity};
use crate::{Context, Error, infra::conditions as cond, secrets};
use ichor_deleteguard::{BootstrapStep, Candidate, bootstrap_step};
use plan::{Tally, Teardown};
use restore::Gate;

pub mod adoption;
pub mod approval;
pub mod discovery;
mod plan;
pub mod restore;

pub(crate) use plan::machines_see;

fn talosconfig_name(cluster: &TalosCluster) -> String {
    format!("{}-talosconfig", cluster.name_any())
}

fn kubeconfig_name(cluster: &TalosCluster) -> String {
    format!("{}-kubeconfig", cluster.name_any())
}

/// The machine's cluster, as an object reference.
fn cluster_of(namespace: Option<String>, cluster: &str) -> ObjectRef<TalosCluster> {
    ObjectRef::new(cluster).within(&namespace.unwrap_or_default())
}

/// The TalosCluster controller: a machine's change, or a class's (which may approve pending
/// machines), reconciles its cluster.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    // The clusters and the machines from the manager's one watch of each (`Context`).
    let controller = Controller::for_shared_stream(
        ctx.clusters.subscribe(Changes::Applied),
        ctx.clusters.store(),
    )
    .with_config(crate::infra::drive::limits(&ctx))
    .watches_shared_stream(
        ctx.machines.subscribe(Changes::Touched),
        |m: Arc<TalosMachine>| Some(cluster_of(m.namespace(), &m.spec.cluster_ref.name)),
    )
    .watches(
        Api::<ichor_api::TalosMachineClass>::all(ctx.client.clone()),
        watcher::Config::default(),
        |c: ichor_api::TalosMachineClass| Some(cluster_of(c.namespace(), &c.spec.cluster_ref.name)),
    );
    crate::infra::drive::drive(controllers::CLUSTER, controller, reconcile, ctx, stop).await;
}

/// Reconciles one TalosCluster.
pub async fn reconcile(cluster: Arc<TalosCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let started = std::time::Instant::now();
    let result = reconcile_inner(&cluster, &ctx).await;
    ctx.metrics.reconciled("TalosCluster", started.elapsed());
    if result.is_ok() {
        ctx.reconciled_ok(&*cluster);
    }
    result
}

async fn write_status(
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

/// Whether `machine` was ever configured with its cluster's bundle: a config applied, an etcd
/// member recorded, or a phase past the first apply.
fn ever_configured(machine: &TalosMachine) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.applied.config_hash.is_some()
            || s.lifecycle.etcd_member_id.is_some()
            || matches!(
                s.lifecycle.phase,
                MachinePhase::Applying
                    | MachinePhase::Installing
                    | MachinePhase::Booting
                    | MachinePhase::Joining
                    | MachinePhase::Ready
                    | MachinePhase::Removing
            )
    })
}

/// `SecretsReady` False with the problem's reason; a Warning Event when the bundle turns lost
/// or mismatched (once, when the reason changes).
async fn bundle_unavailable(
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

/// A deleted cluster is torn down; otherwise: observe (discovery, machines, bundle), record the
/// counts, act on what needs the bundle, record readiness and write status once.
async fn reconcile_inner(cluster: &TalosCluster, ctx: &Context) -> Result<Action, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return teardown(ctx, cluster).await;
    }
    // Held until its machines are removed (a deleted cluster is torn down).
    crate::infra::finalizer::add(
        &clusters_api(ctx, cluster),
        cluster,
        finalizers::CLUSTER_REMOVAL,
    )
    .await?;
    let mut status = cluster.status.clone().unwrap_or_default();
    status.core.observed_generation = cluster.metadata.generation;

    let next_sweep = discover(ctx, cluster).await;
    // As stored until the bundle is recorded and etcd bootstrapped (the never-regenerate and
    // bootstrap-exactly-once rules, `plan::reads_machines_as_stored`); from the cache after.
    let machines = if plan::reads_machines_as_stored(cluster) {
        crate::cluster_machines_as_stored(ctx, cluster).await?
    } else {
        crate::cluster_machines(ctx, cluster).await?
    };
    // The features that do not wait on one another: each runs whatever another's failure,
    // and the first failure is returned once all ran (ADR 0057).
    let mut deferred = Deferred::default();
    // Approvals by TalosMachineClass, one cluster at a time (their changes come back as
    // machine events).
    deferred.keep(
        "class approvals",
        approval::apply_classes(ctx, cluster, &machines).await,
    );
    let bundle = ensure_bundle(ctx, cluster, &mut status, &machines).await?;
    let tally = Tally::of(cluster.spec.control_plane.count, &machines);
    record_counts(ctx, cluster, &mut status, &tally);
    let mut renew_in = None;
    if let Some(bundle) = &bundle {
        adoption::adopt(ctx, cluster, &mut status, bundle).await?;
        renew_in =
            publish_and_bootstrap(ctx, cluster, &mut status, &machines, bundle, &mut deferred)
                .await?;
    }
    record_readiness(ctx, cluster, &mut status, &machines, &tally);
    write_status(ctx, cluster, &status).await?;
    // Node deletes force removals handed over while the workload API did not answer (ADR 0021).
    let nodes_pending = deferred
        .keep(
            "node deletes",
            crate::node_deletes::retry(ctx, cluster).await,
        )
        .unwrap_or(true);
    let tombstoned = nodes_pending
        || cluster
            .status
            .as_ref()
            .is_some_and(|s| !s.tombstones.list.is_empty());
    let on_nodes = plan::waits_on_nodes(
        bundle.is_some(),
        cond::is_true(&status.conditions, conditions::BOOTSTRAPPED),
        tombstoned,
    );
    let due = [next_sweep, renew_in].into_iter().flatten().min();
    deferred.into_result()?;
    Ok(Action::requeue(plan::requeue_after(
        &ctx.settings,
        on_nodes,
        due,
    )))
}

/// The first failure of the features of a cluster's reconcile that do not wait on one
/// another (class approvals, published credentials, node deletes): each is kept here and the
/// reconcile goes on, so none delays the bootstrap or another; the reconcile returns the first
/// once everything ran, and the others are logged.
#[derive(Debug, Default)]
pub(crate) struct Deferred(Option<Error>);

impl Deferred {
    /// The value of `result`, or `None` with its error kept (the first) or logged (`feature`
    /// names it).
    pub(crate) fn keep<T>(&mut self, feature: &str, result: Result<T, Error>) -> Option<T> {
        match result {
            Ok(value) => Some(value),
            Err(error) => {
                tracing::warn!(%feature, %error, "failed; the reconcile goes on and reports it");
                self.0.get_or_insert(error);
                None
            }
        }
    }

    /// The first failure kept, if any.
    pub(crate) fn into_result(self) -> Result<(), Error> {
        self.0.map_or(Ok(()), Err)
    }
}

/// Discovery (reads only): a sweep when one is due; the sweep interval, if the cluster
/// discovers, bounds the next requeue.
async fn discover(ctx: &Context, cluster: &TalosCluster) -> Option<Duration> {
    let discovery = cluster.spec.discovery.as_ref()?;
    let interval = match plan::sweep_interval(&discovery.interval) {
        Ok(interval) => interval,
        Err(invalid) => {
            let note = format!(
                "{invalid}; sweeping every {}s meanwhile",
                plan::DEFAULT_SWEEP_INTERVAL.as_secs()
            );
            tracing::warn!(cluster = %cluster.name_any(), %note, "discovery interval does not read");
            ctx.event(
                cluster,
                EventType::Warning,
                reasons::INVALID_DURATION,
                actions::DISCOVER,
                note,
            )
            .await;
            plan::DEFAULT_SWEEP_INTERVAL
        }
    };
    if ctx.sweep_due(cluster, interval) {
        match discovery::run_once(ctx, cluster, ctx.settings.sweep).await {
            Ok(report) => {
                if !report.created.is_empty() {
                    tracing::info!(cluster = %cluster.name_any(), created = ?report.created, "discovered machines");
                }
            }
            Err(error) => tracing::warn!(%error, "discovery sweep failed"),
        }
    }
    Some(interval)
}

/// The cluster's secrets bundle, recorded in `SecretsReady` (and its fingerprint and Secret in
/// status); `None` while it is unavailable.
async fn ensure_bundle(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
) -> Result<Option<ichor_render::SecretsBundle>, Error> {
    // Secrets: generated only while no machine was ever configured and no node at the
    // cluster's addresses runs configured; lost, never regenerated, after (ichor-deleteguard's
    // bundle_step, ADR 0053).
    let configured = machines.iter().any(ever_configured);
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
            bundle_unavailable(ctx, cluster, status, &problem).await;
            Ok(None)
        }
    }
}

/// The machine counts in status and the `Transitioning` condition they imply.
fn record_counts(
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

/// What needs the bundle: tombstoned nodes reset, the talosconfig published, etcd bootstrapped
/// once, then the workload kubeconfig published; each published file's expiry is recorded.
/// Returns how long until the first of them is due for renewal.
async fn publish_and_bootstrap(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    bundle: &ichor_render::SecretsBundle,
    deferred: &mut Deferred,
) -> Result<Option<Duration>, Error> {
    let credentials = ctx.node_credentials(cluster, bundle)?;
    // A force-removed node that answers again is reset before anything else.
    tombstones(ctx, cluster, status, &credentials).await?;
    let talos = publish_talosconfig(ctx, cluster, bundle, machines).await;
    // A file whose write failed leaves `CredentialsPublished` as it was.
    let mut steps = Vec::new();
    let mut failed = false;
    match deferred.keep("the talosconfig", talos) {
        Some(talos) => steps.push(record_file(cluster, status, File::Talosconfig, talos)),
        None => failed = true,
    }
    if !cond::is_true(&status.conditions, conditions::BOOTSTRAPPED) {
        let fingerprint = crate::secrets::fingerprint(bundle);
        let restoring = match restore::gate(ctx, cluster, status, &fingerprint).await? {
            Gate::Hold => None,
            Gate::Plain => Some(None),
            Gate::Restore(recorded) => Some(Some(recorded)),
        };
        if let Some(restoring) = restoring {
            bootstrap(
                ctx,
                cluster,
                status,
                machines,
                &credentials,
                restoring.as_ref(),
            )
            .await?;
        }
    }
    if cond::is_true(&status.conditions, conditions::BOOTSTRAPPED) {
        let kube = publish_kubeconfig(ctx, cluster, bundle).await;
        match deferred.keep("the kubeconfig", kube) {
            Some(kube) => steps.push(record_file(cluster, status, File::Kubeconfig, kube)),
            None => failed = true,
        }
    }
    let renew_at = steps.iter().filter_map(|s| s.as_ref().ok()).min().copied();
    let taken: Vec<_> = steps.into_iter().filter_map(Result::err).collect();
    if !failed {
        record_published(ctx, cluster, status, &taken).await;
    }
    // A name held by another Secret is looked at again soon: it is published once free.
    let retry = (!taken.is_empty()).then_some(ctx.settings.progress_requeue);
    let renew_in = renew_at.map(|at| renewal::until(at, ctx.clock.now()));
    Ok([renew_in, retry].into_iter().flatten().min())
}

/// A file Ichor publishes for the cluster.
#[derive(Debug, Clone, Copy)]
enum File {
    Talosconfig,
    Kubeconfig,
}

/// Records a published file's Secret and expiry in status, and returns when it is due for
/// renewal; a file not published (its name held by another Secret, which is not Ichor's) has
/// neither.
fn record_file(
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
            talosconfig_name(cluster),
        ),
        File::Kubeconfig => (
            &mut status.core.kubeconfig_secret,
            &mut expiries.kubeconfig_expires_at,
            kubeconfig_name(cluster),
        ),
    };
    let held = published.as_ref().ok();
    *secret = held.map(|_| name);
    *expires = held.map(|h| Time(h.expires));
    published.map(|h| h.renew_at)
}

/// `CredentialsPublished`: true once nothing published is held by another Secret, else false
/// naming each such Secret, with a Warning Event when one is first found (ADR 0053).
async fn record_published(
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

/// A published credentials file after this reconcile: when it expires, when it is due.
#[derive(Debug, Clone, Copy)]
struct Held {
    expires: Timestamp,
    renew_at: Timestamp,
}

/// The published file under `key` of Secret `name`, read by `read`: kept while `current`
/// says it points where it should and it is not due, else minted anew by `mint` (valid for the
/// configured lifetime) and rewritten, with an Event saying why unless it was missing; never
/// read or written when another Secret holds the name ([`secrets::NameTaken`]).
async fn keep_or_mint(
    ctx: &Context,
    cluster: &TalosCluster,
    (name, key, what): (&str, &str, &'static str),
    read: impl FnOnce(&str) -> Option<Published>,
    current: impl FnOnce(&Published) -> bool,
    mint: impl FnOnce(Duration) -> Result<Minted, ichor_render::pki::PkiError>,
) -> Result<Result<Held, secrets::NameTaken>, Error> {
    let text = match secrets::read_published(ctx, cluster, (name, what), key).await? {
        Ok(text) => text,
        Err(taken) => return Ok(Err(taken)),
    };
    let published = text.as_deref().and_then(read);
    let validity = published
        .as_ref()
        .and_then(|p| Validity::from_system(p.not_before, p.not_after));
    let lifetime = ctx.settings.credential_lifetime;
    let is_current = published.as_ref().is_some_and(current);
    let why = match renewal::decide(validity, is_current, lifetime, ctx.clock.now()) {
        Renewal::Keep { renew_at } => {
            let expires = validity.map_or(renew_at, |v| v.not_after);
            return Ok(Ok(Held { expires, renew_at }));
        }
        Renewal::Mint(why) => why,
    };
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

/// The workload kubeconfig Secret: an admin kubeconfig for `spec.endpoint`, renewed at two
/// thirds of its lifetime and re-minted when the endpoint changes.
async fn publish_kubeconfig(
    ctx: &Context,
    cluster: &TalosCluster,
    bundle: &ichor_render::SecretsBundle,
) -> Result<Result<Held, secrets::NameTaken>, Error> {
    let endpoint = &cluster.spec.endpoint;
    let ca = &bundle.certs.k8s.crt.0;
    keep_or_mint(
        ctx,
        cluster,
        (
            &kubeconfig_name(cluster),
            secrets::KUBECONFIG_KEY,
            "the workload kubeconfig",
        ),
        credentials::read_kubeconfig,
        |p| plan::kubeconfig_current(p, endpoint, ca),
        |ttl| credentials::kubeconfig_for(bundle, &cluster.name_any(), endpoint, "admin", ttl),
    )
    .await
}

/// `ConfigRolledOut` and `Ready` on the cluster.
fn record_readiness(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    tally: &Tally,
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

/// The talosconfig Secret: `os:admin` credentials with the control planes as endpoints,
/// renewed at two thirds of its lifetime and re-minted when its endpoints or nodes change.
async fn publish_talosconfig(
    ctx: &Context,
    cluster: &TalosCluster,
    bundle: &ichor_render::SecretsBundle,
    machines: &[TalosMachine],
) -> Result<Result<Held, secrets::NameTaken>, Error> {
    let (endpoints, nodes) = plan::talosconfig_targets(machines);
    let name = cluster.name_any();
    let ca = &bundle.certs.os.crt.0;
    keep_or_mint(
        ctx,
        cluster,
        (
            &talosconfig_name(cluster),
            secrets::TALOSCONFIG_KEY,
            "the talosconfig",
        ),
        |text| credentials::read_talosconfig(text, &name),
        |p| plan::talosconfig_current(p, &endpoints, &nodes, ca),
        |ttl| credentials::talosconfig_for(bundle, &name, &endpoints, &nodes, ttl),
    )
    .await
}

/// Bootstrap exactly once: the chosen machine is recorded in status before the call; etcd
/// running anywhere means no call at all; with a record, no other machine is ever bootstrapped.
async fn bootstrap(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    credentials: &ichor_talos::Credentials,
    restoring: Option<&RestoreStatus>,
) -> Result<(), Error> {
    let (candidates, clients) = bootstrap_candidates(machines, credentials).await;
    let record = status
        .core
        .bootstrap
        .as_ref()
        .map(|r| (r.machine_name.as_str(), r.machine_uid.as_str()));
    match bootstrap_step(record, &candidates) {
        BootstrapStep::Wait => set_bootstrapped(
            ctx,
            cluster,
            status,
            false,
            reasons::WAITING_FOR_CONTROL_PLANE,
            "no configured control plane answers yet",
        ),
        BootstrapStep::WaitForRecorded { name } => set_bootstrapped(
            ctx,
            cluster,
            status,
            false,
            reasons::WAITING_FOR_RECORDED_MACHINE,
            format!(
                "{name} was chosen to bootstrap etcd and does not answer; no other machine will be bootstrapped"
            ),
        ),
        BootstrapStep::AlreadyRunning { name, uid } => {
            if restoring.is_some() && !plan::chosen(status.core.bootstrap.as_ref(), &name) {
                let failure = crate::Stop {
                    reason: reasons::RESTORE_REFUSED_BOOTSTRAPPED,
                    message: format!(
                        "etcd already runs on {name}: a restore goes only into a cluster whose etcd was never bootstrapped"
                    ),
                };
                restore::failed(ctx, cluster, status, &failure).await;
                return Ok(());
            }
            if restoring.is_some() {
                // Bootstrapped from the backup before a restart could record it.
                restore::completed(ctx, cluster, status).await;
            }
            status.core.bootstrap.get_or_insert(BootstrapRecord {
                machine_name: name.clone(),
                machine_uid: uid,
                chosen_at: ctx.now(),
                completed_at: Some(ctx.now()),
            });
            let message = format!("etcd already runs ({name} reports members)");
            set_bootstrapped(ctx, cluster, status, true, reasons::ETCD_RUNNING, message);
        }
        BootstrapStep::Choose { name, uid } => {
            record_bootstrap_choice(ctx, cluster, status, name, uid).await?;
        }
        BootstrapStep::Call { name } => {
            let client = plan::kept_connection(clients, &name)?;
            call_bootstrap(ctx, cluster, status, &name, &client, restoring).await;
        }
    }
    Ok(())
}

/// Each configured control plane as a bootstrap candidate: whether it answers and how many etcd
/// members it reports; the connections are kept for the call.
async fn bootstrap_candidates(
    machines: &[TalosMachine],
    credentials: &ichor_talos::Credentials,
) -> (Vec<Candidate>, Vec<(String, Option<TalosClient>)>) {
    let mut candidates = Vec::new();
    let mut clients = Vec::new();
    for m in machines.iter().filter(|m| plan::bootstrap_candidate(m)) {
        let client = crate::connect(&plan::bootstrap_address(m), credentials).await;
        let members = match &client {
            Some(c) => c.etcd_members(true).await.map(|m| m.len()).unwrap_or(0),
            None => 0,
        };
        candidates.push(Candidate {
            name: m.name_any(),
            uid: m.uid().unwrap_or_default(),
            reachable: client.is_some(),
            members,
        });
        clients.push((m.name_any(), client));
    }
    (candidates, clients)
}

/// Sets the cluster's `Bootstrapped` condition.
fn set_bootstrapped(
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
async fn record_bootstrap_choice(
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

/// Calls Bootstrap on the recorded machine `name`: done (either way) completes the record with an
/// Event; a failure leaves `Bootstrapped` False with the cause, for the next reconcile.
async fn call_bootstrap(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    name: &str,
    client: &TalosClient,
    restoring: Option<&RestoreStatus>,
) {
    let patience = ctx.settings.bootstrap_patience;
    let answer = match restoring {
        None => client.bootstrap(patience).await,
        Some(recorded) => {
            // After a restart the upload may have been restored already: etcd then runs.
            let running = client
                .etcd_members(true)
                .await
                .is_ok_and(|members| !members.is_empty());
            let uploaded = if running {
                Ok(())
            } else {
                restore::upload(ctx, cluster, recorded, client).await
            };
            if let Err(failure) = uploaded {
                restore::failed(ctx, cluster, status, &failure).await;
                return;
            }
            client.bootstrap_recover(patience, false).await
        }
    };
    let (done, reason, message) = plan::bootstrap_answered(name, &answer);
    set_bootstrapped(ctx, cluster, status, done, reason, message.clone());
    if !done {
        return;
    }
    if restoring.is_some() {
        restore::completed(ctx, cluster, status).await;
    }
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

fn clusters_api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

/// Tearing a deleted cluster down (ADR 0009): machines never configured go at once, then the
/// workers, then the control planes one by one, the last one reset without a graceful leave.
/// Each removal runs the removal sequence under the cluster lock. The bundle Secret stays.
async fn teardown(ctx: &Context, cluster: &TalosCluster) -> Result<Action, Error> {
    if !crate::infra::finalizer::has(cluster, finalizers::CLUSTER_REMOVAL) {
        return Ok(Action::await_change());
    }
    // Admission may never have seen this delete (the webhook unregistered): the annotation is
    // checked here too, and nothing is touched without it (ADR 0052).
    let view = ichor_deleteguard::Cluster::from(cluster);
    if let Err(refusal) = ichor_deleteguard::check_cluster_teardown(&view) {
        teardown_held(ctx, cluster, &refusal).await?;
        // Adding the annotation changes the TalosCluster, whose watch reconciles it again.
        return Ok(Action::await_change());
    }
    // As stored: the teardown ends (and the bundle goes) only once no machine is left, not
    // once the cache saw none.
    let machines = crate::cluster_machines_as_stored(ctx, cluster).await?;
    match plan::teardown(&machines) {
        Teardown::Finished => {
            finish_teardown(ctx, cluster).await?;
            Ok(Action::await_change())
        }
        Teardown::Remove {
            delete,
            workers,
            control_planes,
        } => {
            delete_machines(ctx, cluster, &delete).await?;
            let mut status = cluster.status.clone().unwrap_or_default();
            cond::set(
                &mut status.conditions,
                conditions::READY,
                false,
                reasons::TEARING_DOWN,
                format!(
                    "the cluster is being deleted: {workers} worker(s) and {control_planes} control plane(s) left, removed workers first, then control planes one by one"
                ),
                cluster.metadata.generation,
                &ctx.now(),
            );
            write_status(ctx, cluster, &status).await?;
            Ok(Action::requeue(ctx.settings.progress_requeue))
        }
    }
}

/// A teardown held for the allow-delete annotation: `Ready` False with the refusal, and a
/// Warning Event when it is first held.
async fn teardown_held(
    ctx: &Context,
    cluster: &TalosCluster,
    refusal: &ichor_deleteguard::Refusal,
) -> Result<(), Error> {
    let stop = crate::Stop::new(refusal.reason(), refusal.message());
    let mut status = cluster.status.clone().unwrap_or_default();
    let before = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::READY)
        .map(|c| c.reason.clone());
    stop.set_condition(
        &mut status.conditions,
        conditions::READY,
        cluster.metadata.generation,
        &ctx.now(),
    );
    write_status(ctx, cluster, &status).await?;
    if before.as_deref() != Some(stop.reason) {
        stop.warn(ctx, cluster, actions::DELETE).await;
    }
    Ok(())
}

/// Deletes the TalosMachines `names` (one already gone is fine), an Event for each.
async fn delete_machines(
    ctx: &Context,
    cluster: &TalosCluster,
    names: &[String],
) -> Result<(), Error> {
    let api: Api<TalosMachine> =
        Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default());
    for name in names {
        match api.delete(name, &DeleteParams::default()).await {
            Ok(_) => {
                ctx.event(
                    cluster,
                    EventType::Normal,
                    reasons::TEARING_DOWN,
                    actions::DELETE,
                    format!("removing {name} (cluster teardown)"),
                )
                .await;
            }
            Err(kube::Error::Api(s)) if s.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Every machine is removed: says the bundle Secret is kept and releases the cluster's finalizer.
async fn finish_teardown(ctx: &Context, cluster: &TalosCluster) -> Result<(), Error> {
    ctx.event(
        cluster,
        EventType::Normal,
        reasons::TEARING_DOWN,
        actions::DELETE,
        format!(
            "every machine removed; the secrets bundle Secret {} is kept (delete it yourself once you no longer need the cluster's CA keys)",
            secrets::bundle_secret_name(cluster)
        ),
    )
    .await;
    ctx.forget_credentials(cluster);
    crate::infra::finalizer::remove(
        &clusters_api(ctx, cluster),
        cluster,
        finalizers::CLUSTER_REMOVAL,
    )
    .await
}

/// Nodes removed without their reset: one that answers the cluster's credentials again is
/// reset (STATE and EPHEMERAL, reboot) if it is the machine removed (its SMBIOS UUID, ADR
/// 0052); one found in maintenance mode needs nothing more. A node at a tombstoned address
/// that is not told to be the machine is left alone, and `NodeIdentityVerified` says so.
async fn tombstones(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    credentials: &ichor_talos::Credentials,
) -> Result<(), Error> {
    let stones = cluster
        .status
        .as_ref()
        .map(|s| s.tombstones.list.clone())
        .unwrap_or_default();
    let mut refused = Vec::new();
    for stone in stones {
        match clear_tombstone(ctx, cluster, credentials, &stone).await? {
            Cleared::Yes => write_tombstones(ctx, cluster, &stone).await?,
            Cleared::No => {}
            Cleared::Refused(refusal) => refused.push(refusal),
        }
    }
    report_identity(ctx, cluster, status, &refused).await;
    Ok(())
}

/// What became of a tombstone.
enum Cleared {
    /// It no longer needs watching.
    Yes,
    /// It is still watched: its node does not answer the cluster's credentials.
    No,
    /// Its node answers, but is not told to be the machine removed: not reset.
    Refused(ichor_deleteguard::IdentityRefusal),
}

/// `NodeIdentityVerified` False while nodes at tombstoned addresses are refused (a Warning
/// Event when what is refused changes), absent otherwise.
async fn report_identity(
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

/// What became of `stone`: cleared when it answered the cluster's credentials as the machine
/// removed and was reset (with a Warning Event), or is found in maintenance mode.
async fn clear_tombstone(
    ctx: &Context,
    cluster: &TalosCluster,
    credentials: &ichor_talos::Credentials,
    stone: &Tombstone,
) -> Result<Cleared, Error> {
    let answered = tokio::time::timeout(Duration::from_secs(2), async {
        let client = crate::connect(&stone.address, credentials).await?;
        client.version().await.ok().map(|_| client)
    })
    .await
    .ok()
    .flatten();
    let Some(client) = answered else {
        let reset = crate::in_maintenance(&stone.address, ctx.settings.sweep)
            .await
            .is_some();
        return Ok(if reset { Cleared::Yes } else { Cleared::No });
    };
    let meant = ichor_deleteguard::Meant::Tombstone(stone.machine.clone());
    let recorded = stone.uuid.as_deref();
    match crate::identity::check(&client, &meant, &stone.address, "reset", recorded).await {
        crate::identity::Checked::Verified => {}
        crate::identity::Checked::Refused(refusal) => return Ok(Cleared::Refused(refusal)),
        crate::identity::Checked::Unread(_) => return Ok(Cleared::No),
    }
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
    Ok(Cleared::Yes)
}

/// Takes the cleared `stone` out of the cluster's freshly read tombstones.
async fn write_tombstones(
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
