//! The cluster reconciler: secrets, discovery, bootstrap exactly once, published credentials,
//! and the cluster's status aggregated from its machines.
//!
//! Read top to bottom: the wiring (`run_controller`), then [`reconcile`]'s flow. A deleted
//! cluster is torn down (`teardown`). Otherwise its machines are read (`observe`), and the
//! features run that do not wait on one another (class approvals in [`approval`], discovery
//! in [`discovery`], published credentials, node deletes); the bundle is ensured, the
//! cluster adopted ([`adoption`]) or bootstrapped once (from a backup: [`restore`]), and its
//! status written once. `plan` decides (pure, with the unit tests); `act` writes and records.

use std::sync::Arc;
use std::time::Duration;

use ichor_api::backup::RestoreStatus;
use ichor_api::cluster::TalosClusterStatus;
use ichor_api::names::{conditions, controllers, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_render::credentials::{self, Minted, Published};
use ichor_talos::TalosClient;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::watcher;

use crate::infra::shared::Changes;
use crate::renewal::{self, Renewal, Validity};
use crate::{Context, Error, infra::conditions as cond, secrets};
use ichor_deleteguard::{BootstrapStep, bootstrap_step};
use observe::TombstoneLook;
use plan::{File, Held, Tally};
use restore::Gate;

mod act;
pub mod adoption;
pub mod approval;
pub mod discovery;
mod manifests;
mod observe;
mod plan;
pub mod restore;
mod teardown;

pub(crate) use plan::machines_see;

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

/// A deleted cluster is torn down; otherwise: observe (discovery, machines, bundle), record the
/// counts, act on what needs the bundle, record readiness and write status once.
async fn reconcile_inner(cluster: &TalosCluster, ctx: &Context) -> Result<Action, Error> {
    if cluster.metadata.deletion_timestamp.is_some() {
        return teardown::tear_down(ctx, cluster).await;
    }
    act::add_finalizer(ctx, cluster).await?;
    let mut status = cluster.status.clone().unwrap_or_default();
    status.core.observed_generation = cluster.metadata.generation;

    let next_sweep = discovery::sweep_when_due(ctx, cluster).await;
    let machines = observe::read_machines(ctx, cluster).await?;
    // The features that do not wait on one another: each runs whatever another's failure,
    // and the first failure is returned once all ran (ADR 0057).
    let mut deferred = Deferred::default();
    // Approvals by TalosMachineClass, one cluster at a time (their changes come back as
    // machine events).
    deferred.keep(
        "class approvals",
        approval::apply_classes(ctx, cluster, &machines).await,
    );
    let bundle = act::ensure_bundle(ctx, cluster, &mut status, &machines).await?;
    let tally = Tally::of(cluster.spec.control_plane.count, &machines);
    act::record_counts(ctx, cluster, &mut status, &tally);
    let (mut renew_in, mut synced) = (None, None);
    if let Some(bundle) = &bundle {
        adoption::adopt(ctx, cluster, &mut status, bundle).await?;
        (renew_in, synced) =
            publish_and_bootstrap(ctx, cluster, &mut status, &machines, bundle, &mut deferred)
                .await?;
    }
    act::record_readiness(
        ctx,
        cluster,
        &mut status,
        &machines,
        &tally,
        synced.as_ref(),
    );
    act::write_status(ctx, cluster, &status).await?;
    act::announce_versions(ctx, cluster, &status, synced.as_ref()).await;
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

/// What needs the bundle: tombstoned nodes reset, the talosconfig published, etcd bootstrapped
/// once, then the workload kubeconfig published; each published file's expiry is recorded; and
/// a Kubernetes rollout's last step, the bootstrap manifests synced (ADR 0070). Returns how long
/// until the first of them is due (a renewal, a sync to retry), and the sync if one was due.
async fn publish_and_bootstrap(
    ctx: &Context,
    cluster: &TalosCluster,
    status: &mut TalosClusterStatus,
    machines: &[TalosMachine],
    bundle: &ichor_render::SecretsBundle,
    deferred: &mut Deferred,
) -> Result<(Option<Duration>, Option<manifests::Synced>), Error> {
    let credentials = ctx.node_credentials(cluster, bundle)?;
    // A force-removed node that answers again is reset before anything else.
    clear_tombstones(ctx, cluster, status, &credentials).await?;
    let talos = publish_talosconfig(ctx, cluster, bundle, machines).await;
    // A file whose write failed leaves `CredentialsPublished` as it was.
    let mut steps = Vec::new();
    let mut failed = false;
    match deferred.keep("the talosconfig", talos) {
        Some(talos) => steps.push(act::record_file(cluster, status, File::Talosconfig, talos)),
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
            Some(kube) => steps.push(act::record_file(cluster, status, File::Kubeconfig, kube)),
            None => failed = true,
        }
    }
    let renew_at = steps.iter().filter_map(|s| s.as_ref().ok()).min().copied();
    let taken: Vec<_> = steps.into_iter().filter_map(Result::err).collect();
    if !failed {
        act::record_published(ctx, cluster, status, &taken).await;
    }
    // A name held by another Secret is looked at again soon: it is published once free.
    let retry = (!taken.is_empty()).then_some(ctx.settings.progress_requeue);
    let renew_in = renew_at.map(|at| renewal::until(at, ctx.clock.now()));
    let synced = deferred
        .keep(
            "the bootstrap manifests",
            manifests::sync_when_due(ctx, cluster, status, machines, bundle).await,
        )
        .flatten();
    // A sync that failed is tried again soon.
    let resync = matches!(synced, Some(manifests::Synced::Failed(_)))
        .then_some(ctx.settings.progress_requeue);
    let due = [renew_in, retry, resync].into_iter().flatten().min();
    Ok((due, synced))
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
            &plan::talosconfig_name(cluster),
            secrets::TALOSCONFIG_KEY,
            "the talosconfig",
        ),
        |text| credentials::read_talosconfig(text, &name),
        |p| plan::talosconfig_current(p, &endpoints, &nodes, ca),
        |ttl| credentials::talosconfig_for(bundle, &name, &endpoints, &nodes, ttl),
    )
    .await
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
            &plan::kubeconfig_name(cluster),
            secrets::KUBECONFIG_KEY,
            "the workload kubeconfig",
        ),
        credentials::read_kubeconfig,
        |p| plan::kubeconfig_current(p, endpoint, ca),
        |ttl| credentials::kubeconfig_for(bundle, &cluster.name_any(), endpoint, "admin", ttl),
    )
    .await
}

/// The published file under `key` of Secret `name`, read by `read`: kept while `current`
/// says it points where it should and it is not due, else minted anew by `mint` (valid for the
/// configured lifetime) and rewritten, with an Event saying why unless it was missing; never
/// read or written when another Secret holds the name ([`secrets::NameTaken`]).
async fn keep_or_mint(
    ctx: &Context,
    cluster: &TalosCluster,
    file: (&str, &str, &'static str),
    read: impl FnOnce(&str) -> Option<Published>,
    current: impl FnOnce(&Published) -> bool,
    mint: impl FnOnce(Duration) -> Result<Minted, ichor_render::pki::PkiError>,
) -> Result<Result<Held, secrets::NameTaken>, Error> {
    let published = match observe::read_published(ctx, cluster, file, read).await? {
        Ok(published) => published,
        Err(taken) => return Ok(Err(taken)),
    };
    let validity = published
        .as_ref()
        .and_then(|p| Validity::from_system(p.not_before, p.not_after));
    let lifetime = ctx.settings.credential_lifetime;
    let is_current = published.as_ref().is_some_and(current);
    match renewal::decide(validity, is_current, lifetime, ctx.clock.now()) {
        Renewal::Keep { renew_at } => {
            let expires = validity.map_or(renew_at, |v| v.not_after);
            Ok(Ok(Held { expires, renew_at }))
        }
        Renewal::Mint(why) => act::mint_file(ctx, cluster, file, why, mint).await,
    }
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
    let (candidates, clients) = observe::bootstrap_candidates(machines, credentials).await;
    let record = status
        .core
        .bootstrap
        .as_ref()
        .map(|r| (r.machine_name.as_str(), r.machine_uid.as_str()));
    match bootstrap_step(record, &candidates) {
        BootstrapStep::Wait => act::set_bootstrapped(
            ctx,
            cluster,
            status,
            false,
            reasons::WAITING_FOR_CONTROL_PLANE,
            "no configured control plane answers yet",
        ),
        BootstrapStep::WaitForRecorded { name } => act::set_bootstrapped(
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
                let failure = plan::restore_into_running_etcd(&name);
                restore::failed(ctx, cluster, status, &failure).await;
                return Ok(());
            }
            if restoring.is_some() {
                // Bootstrapped from the backup before a restart could record it.
                restore::completed(ctx, cluster, status).await;
            }
            act::record_etcd_running(ctx, cluster, status, name, uid);
        }
        BootstrapStep::Choose { name, uid } => {
            act::record_bootstrap_choice(ctx, cluster, status, name, uid).await?;
        }
        BootstrapStep::Call { name } => {
            let client = plan::kept_connection(clients, &name)?;
            call_bootstrap(ctx, cluster, status, &name, &client, restoring).await;
        }
    }
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
    let answer = match restoring {
        None => act::bootstrap_etcd(ctx, client).await,
        Some(recorded) => {
            // After a restart the upload may have been restored already: etcd then runs.
            let uploaded = if observe::etcd_runs(client).await {
                Ok(())
            } else {
                restore::upload(ctx, cluster, recorded, client).await
            };
            if let Err(failure) = uploaded {
                restore::failed(ctx, cluster, status, &failure).await;
                return;
            }
            act::recover_etcd(ctx, client).await
        }
    };
    let (done, reason, message) = plan::bootstrap_answered(name, &answer);
    act::set_bootstrapped(ctx, cluster, status, done, reason, message.clone());
    if !done {
        return;
    }
    if restoring.is_some() {
        restore::completed(ctx, cluster, status).await;
    }
    act::record_bootstrapped(ctx, cluster, status, message).await;
}

/// Nodes removed without their reset: one that answers the cluster's credentials again is
/// reset (STATE and EPHEMERAL, reboot) if it is the machine removed (its SMBIOS UUID, ADR
/// 0052); one found in maintenance mode needs nothing more. A node at a tombstoned address
/// that is not told to be the machine is left alone, and `NodeIdentityVerified` says so.
async fn clear_tombstones(
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
        match observe::look_at_tombstone(ctx, credentials, &stone).await {
            TombstoneLook::Silent | TombstoneLook::Unread => {}
            TombstoneLook::InMaintenance => act::write_tombstones(ctx, cluster, &stone).await?,
            TombstoneLook::Refused(refusal) => refused.push(refusal),
            TombstoneLook::Verified(client) => {
                act::reset_tombstoned(ctx, cluster, &stone, &client).await?;
                act::write_tombstones(ctx, cluster, &stone).await?;
            }
        }
    }
    act::record_identity(ctx, cluster, status, &refused).await;
    Ok(())
}
