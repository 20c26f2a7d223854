//! The manager: five controllers that take machines booted into Talos maintenance mode to a
//! Ready cluster and keep it so. Each reconcile observes, decides (pure functions, unit-tested)
//! and acts; nothing is written to a machine nobody approved.
//!
//! # Layout
//!
//! - Code used by one controller lives in `controller/<kind>/`: `mod.rs` is its reconcile,
//!   `plan.rs` its pure decisions, and a flow with recorded steps a folder of the same shape.
//! - Code shared by controllers lives at the crate root, named for what it acts on (the
//!   cluster [`lock`], the bundle's [`secrets`], a machine's [`claims`], the
//!   [`backup_store`]); plumbing that knows nothing of Talos lives in [`infra`].
//!
//! # Glossary
//!
//! - **look**: one reconcile of a machine: it observes the node and records what it saw.
//! - **settled**: a machine with nothing in progress, looked at again at the settled pace
//!   (`Settings::settled_requeue`, [`Settings::settled_looks_per_second`] fleet-wide).
//! - **echo**: a reconcile caused only by the object's own last status write; it waits for
//!   its due look instead of observing again (ADR 0034).
//! - **standing**: where a machine stands as its status says (phase and conditions); a machine
//!   that stands still is looked at less often.
#![forbid(unsafe_code)]
// Reconcilers observe, plan (pure functions) and act; a function much past 60 lines
// (clippy.toml) mixes them.
#![warn(clippy::too_many_lines)]

pub mod backup_store;
pub mod claims;
pub mod controller;
pub mod decide;
pub mod drift;
pub mod error;
pub mod identity;
pub mod infra;
pub mod layers;
#[cfg(test)]
mod layout;
pub mod lock;
pub mod node_deletes;
pub mod observe;
pub mod own;
pub mod renewal;
pub mod secrets;
#[cfg(test)]
mod tuning;
pub mod workload;

use controller::{backup, cluster, machine, operation, storage};
use infra::{panics, status, tasks};
use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use ichor_api::names::controllers;
use ichor_api::operation::TalosOperation;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_service::Health;
use ichor_talos::discovery::SweepConfig;
use ichor_talos::{Credentials, TalosClient};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};

pub use error::{Category, Error};
pub use infra::clock::{Clock, SystemClock, TestClock};
pub use infra::metrics::Metrics;

/// The default install stall limit: a real machine pulls the installer image and writes the
/// disk in minutes; half an hour leaves room for a slow mirror or disk.
pub const DEFAULT_INSTALL_STALL_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How nodes are probed during discovery.
    pub sweep: SweepConfig,
    /// How long Bootstrap may keep answering `FailedPrecondition` in one attempt.
    pub bootstrap_patience: Duration,
    /// Requeue while a machine or cluster is progressing.
    pub progress_requeue: Duration,
    /// Requeue once settled.
    pub settled_requeue: Duration,
    /// At most how many settled machines are looked at a second, fleet-wide: a fleet bigger
    /// than this many settled requeues' worth waits longer between settled looks (ADR 0041).
    pub settled_looks_per_second: u32,
    /// How long an install may run before the machine shows `InstallStalled` (Talos puts no
    /// deadline on its installer).
    pub install_stall_limit: Duration,
    /// Who writes Events.
    pub reporter: String,
    /// This replica's identity (pod name).
    pub instance: String,
    /// How long the published kubeconfig and talosconfig certificates live (renewed at two
    /// thirds of it).
    pub credential_lifetime: Duration,
    /// How long the certificates the manager mints for its own calls live (renewed at two
    /// thirds of it).
    pub own_credential_lifetime: Duration,
    /// How many reconciles of one kind run at once (each controller's limit): what bounds the
    /// Talos connections and the reconcile state held at once, whatever the fleet size.
    pub concurrency: u16,
}

/// Reconciles of one kind that run at once unless `--concurrent-reconciles` says.
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Settled looks a second unless `--settled-looks-per-second` says: up to 180 machines are
/// looked at every settled requeue (60 s), a bigger fleet less often (ADR 0041).
pub const DEFAULT_SETTLED_LOOKS_PER_SECOND: u32 = 3;

impl Default for Settings {
    fn default() -> Self {
        Self {
            sweep: SweepConfig::default(),
            bootstrap_patience: Duration::from_secs(10),
            progress_requeue: Duration::from_secs(2),
            settled_requeue: Duration::from_secs(60),
            settled_looks_per_second: DEFAULT_SETTLED_LOOKS_PER_SECOND,
            install_stall_limit: DEFAULT_INSTALL_STALL_LIMIT,
            reporter: "ichor-manager".into(),
            instance: "ichor-manager".into(),
            credential_lifetime: ichor_render::credentials::CLIENT_TTL,
            own_credential_lifetime: Duration::from_secs(3600),
            concurrency: DEFAULT_CONCURRENCY,
        }
    }
}

/// Shared by every reconcile.
pub struct Context {
    /// The Kubernetes client.
    pub client: kube::Client,
    /// Tunables.
    pub settings: Settings,
    /// Metrics.
    pub metrics: Arc<Metrics>,
    /// Where decisions and records read the time.
    pub clock: Arc<dyn Clock>,
    recorder: Recorder,
    /// When each cluster (namespace/name, generation) was last swept.
    last_sweep: Mutex<BTreeMap<String, (Timestamp, Option<i64>)>>,
    /// Per-object backoff for transient errors.
    backoff: error::Backoff,
    /// The objects whose reconciles panicked, and until when each waits.
    panics: panics::Panics,
    /// What `/healthz` reports: a controller that stops fails it.
    pub health: Arc<Health>,
    /// The manager's own short-lived credentials, per cluster.
    own: own::Cache,
    /// The machine classes and storages configs render from (watch caches).
    pub layers: layers::Layers,
    /// The clusters with a backup running (one at a time per cluster).
    backups: backup::InFlight,
    /// The last look at each machine in progress (echoes of its own writes wait).
    pub looks: machine::Looks,
    /// Discovery's probes in flight, shared by every sweep: the sweep concurrency bounds them
    /// manager-wide, not per cluster.
    pub(crate) probes: Arc<tokio::sync::Semaphore>,
}

impl Context {
    /// A context whose client reaches nothing (an address nothing listens on), for unit tests:
    /// every Kubernetes call fails.
    #[cfg(test)]
    pub(crate) fn nowhere(settings: Settings) -> Self {
        let nowhere = kube::Client::try_from(kube::Config::new(
            "http://127.0.0.1:9".parse().expect("url"),
        ))
        .expect("client");
        Self::new(nowhere, settings, Arc::new(Metrics::default()))
    }

    /// A context for `client`.
    pub fn new(client: kube::Client, settings: Settings, metrics: Arc<Metrics>) -> Self {
        let recorder = Recorder::new(
            client.clone(),
            Reporter {
                controller: settings.reporter.clone(),
                instance: Some(settings.instance.clone()),
            },
        );
        let probes = Arc::new(tokio::sync::Semaphore::new(
            settings.sweep.concurrency.max(1),
        ));
        Self {
            client,
            settings,
            metrics,
            clock: Arc::new(SystemClock),
            recorder,
            last_sweep: Mutex::new(BTreeMap::new()),
            backoff: error::Backoff::default(),
            panics: panics::Panics::default(),
            health: Arc::new(Health::default()),
            own: own::Cache::default(),
            layers: layers::Layers::default(),
            backups: backup::InFlight::default(),
            looks: machine::Looks::default(),
            probes,
        }
    }

    /// The same context reading the time from `clock`.
    #[must_use]
    pub fn with_clock(mut self, clock: Arc<dyn Clock>) -> Self {
        self.clock = clock;
        self
    }

    /// The same context recording a stopped controller in `health` (the one `/healthz`
    /// serves).
    #[must_use]
    pub fn with_health(mut self, health: Arc<Health>) -> Self {
        self.health = health;
        self
    }

    /// `machines`, recorded as woken by a related object (so that none is taken for an echo
    /// of its own writes).
    fn woke(&self, machines: Vec<ObjectRef<TalosMachine>>) -> Vec<ObjectRef<TalosMachine>> {
        self.looks.wake(&machines);
        machines
    }

    /// The current time, as recorded in status fields.
    pub fn now(&self) -> Time {
        Time(self.clock.now())
    }

    /// Forgets `object`'s transient failures: it reconciled.
    pub(crate) fn reconciled_ok<K: Resource<DynamicType = ()>>(&self, object: &K) {
        self.backoff.reset(&error::key(object));
    }

    /// Publishes an Event about `object`; a failure to publish is logged, never fatal.
    pub async fn event<K>(
        &self,
        object: &K,
        type_: EventType,
        reason: &str,
        action: &str,
        note: String,
    ) where
        K: Resource<DynamicType = ()>,
    {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(note),
            action: action.to_owned(),
            secondary: None,
        };
        if let Err(error) = self.recorder.publish(&event, &object.object_ref(&())).await {
            tracing::warn!(%error, reason, "cannot publish an event");
        }
    }

    /// Whether the cluster is due for a sweep (its interval passed, or its spec changed); marks
    /// it swept if so.
    pub(crate) fn sweep_due(&self, cluster: &TalosCluster, interval: Duration) -> bool {
        let key = format!(
            "{}/{}",
            cluster.namespace().unwrap_or_default(),
            cluster.name_any()
        );
        let Ok(mut map) = self.last_sweep.lock() else {
            return true;
        };
        let now = self.clock.now();
        let due = decide::sweep_due(
            map.get(&key).copied(),
            cluster.metadata.generation,
            interval,
            now,
        );
        if due {
            map.insert(key, (now, cluster.metadata.generation));
        }
        due
    }
}

/// The field selector of a cluster's machines (`spec.clusterRef.name`, a selectable field of
/// the TalosMachine CRD).
pub const CLUSTER_REF_FIELD: &str = "spec.clusterRef.name";

/// Every TalosMachine of `cluster` (they live in its namespace), as stored now: a list the
/// apiserver filters by `spec.clusterRef.name`, so a cluster's reconcile reads its own machines,
/// not the fleet's (ADR 0029). An apiserver without CRD field selectors (before Kubernetes
/// 1.31) refuses the selector; the namespace is then listed whole. Either way the machines are
/// checked against the cluster here too.
pub async fn cluster_machines(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Vec<TalosMachine>, Error> {
    let name = cluster.name_any();
    let api = Api::<TalosMachine>::namespaced(
        ctx.client.clone(),
        &cluster.namespace().unwrap_or_default(),
    );
    let selected = kube::api::ListParams::default().fields(&format!("{CLUSTER_REF_FIELD}={name}"));
    let listed = match api.list(&selected).await {
        Ok(listed) => listed,
        Err(kube::Error::Api(status)) if status.code == 400 => {
            api.list(&kube::api::ListParams::default()).await?
        }
        Err(error) => return Err(error.into()),
    };
    Ok(listed
        .items
        .into_iter()
        .filter(|m| m.spec.cluster_ref.name == name)
        .collect())
}

/// A mutual-TLS connection to a configured node.
pub async fn connect(address: &str, credentials: &Credentials) -> Option<TalosClient> {
    TalosClient::connect(address, credentials).await.ok()
}

/// Whether the node at `address` (`ip` or `ip:port`) answers in maintenance mode; its
/// fingerprint if so (a reset node is back there with a new one).
pub async fn in_maintenance(address: &str, sweep: SweepConfig) -> Option<String> {
    let socket = address.parse::<std::net::SocketAddr>().ok().or_else(|| {
        address
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| std::net::SocketAddr::new(ip, sweep.port))
    })?;
    let std::net::IpAddr::V4(ip) = socket.ip() else {
        return None;
    };
    let config = SweepConfig {
        port: socket.port(),
        ..sweep
    };
    match ichor_talos::discovery::probe(ip, config).await? {
        ichor_talos::discovery::ProbeOutcome::Maintenance(found) => Some(found.fingerprint),
        _ => None,
    }
}

/// What a failed reconcile leads to: an object a person must fix waits for a change (with a
/// Warning Event saying why), a transient fault backs off per object, a bug is logged as an
/// error (and published) and retried slowly, a panic (caught, and already logged) is published
/// and retried after its object's backoff (`panics`).
fn error_policy<K>(object: Arc<K>, error: &Error, ctx: Arc<Context>) -> Action
where
    K: Resource<DynamicType = ()> + Send + Sync + 'static,
{
    ctx.metrics.error(error.reason());
    let name = object.meta().name.clone().unwrap_or_default();
    let category = error.category();
    let action = match category {
        Category::UserFix => {
            tracing::warn!(%name, %error, "reconcile failed; waiting for a change");
            Action::await_change()
        }
        Category::Transient => {
            let delay = ctx.backoff.next(&error::key(&*object));
            tracing::warn!(%name, %error, ?delay, "reconcile failed; retrying");
            return Action::requeue(delay);
        }
        Category::Bug => {
            tracing::error!(%name, %error, "reconcile failed on a broken invariant");
            Action::requeue(error::BUG_REQUEUE)
        }
        Category::Panicked => Action::requeue(error.retry_after().unwrap_or(error::BUG_REQUEUE)),
    };
    let (reason, note) = (error.reason(), error.to_string());
    tokio::spawn(async move {
        ctx.event(
            &*object,
            EventType::Warning,
            reason,
            ichor_api::names::actions::RECONCILE,
            note,
        )
        .await;
    });
    action
}

/// The machines of cluster `cluster` in `namespace`, from the machine cache: what a change of
/// one of its classes or storages re-renders.
fn machines_of(
    known: &kube::runtime::reflector::Store<TalosMachine>,
    namespace: Option<String>,
    cluster: &str,
) -> Vec<ObjectRef<TalosMachine>> {
    known
        .state()
        .into_iter()
        .filter(|m| m.spec.cluster_ref.name == cluster && m.namespace() == namespace)
        .map(|m| ObjectRef::from_obj(&*m))
        .collect()
}

/// What each cluster's machines were last woken for ([`cluster::machines_see`]'s digest, by
/// namespace and name): a cluster event that changes none of it wakes no machine (ADR 0029).
#[derive(Debug, Default)]
struct Woken(Mutex<BTreeMap<(Option<String>, String), u64>>);

impl Woken {
    /// Whether `cluster`'s machines are to be woken: its digest differs from the last one
    /// they were woken for (which it then becomes).
    fn again(&self, cluster: &TalosCluster) -> bool {
        let digest = cluster::machines_see(cluster);
        let key = (cluster.namespace(), cluster.name_any());
        let mut seen = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        seen.insert(key, digest) != Some(digest)
    }
}

/// Resolves once the manager is told to stop.
async fn stopped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// The machine's cluster, as an object reference.
fn cluster_of(namespace: Option<String>, cluster: &str) -> ObjectRef<TalosCluster> {
    ObjectRef::new(cluster).within(&namespace.unwrap_or_default())
}

/// Runs `controller` until the manager stops, every reconcile of it under
/// [`panics::guard`] (named `name`): the one place each controller's reconciles run, so a
/// panic in one never ends a controller.
async fn drive<K, F, Fut>(
    name: &'static str,
    controller: Controller<K>,
    reconcile: F,
    ctx: Arc<Context>,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    K: panics::Reconciled + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    F: Fn(Arc<K>, Arc<Context>) -> Fut + Copy + Send + Sync + 'static,
    Fut: std::future::Future<Output = Result<Action, Error>> + Send + 'static,
{
    let cache = controller.store();
    let run = controller
        .graceful_shutdown_on(stopped(stop.clone()))
        .run(panics::guard(name, reconcile), error_policy, ctx)
        .for_each(|_| async {});
    tokio::select! {
        biased;
        () = run => {}
        () = stopped_unfilled(cache, stop) => {}
    }
}

/// Resolves once the manager is told to stop while `cache` has not filled yet. kube's graceful
/// shutdown never ends then: its runner starts no reconcile before the cache is filled, and
/// once shutting down it no longer polls the watch that would fill it. Nothing ran, so there
/// is nothing to wait for. A cache that filled leaves the graceful shutdown to end by itself.
async fn stopped_unfilled<K>(
    cache: kube::runtime::reflector::Store<K>,
    stop: tokio::sync::watch::Receiver<bool>,
) where
    K: kube::Resource + Clone + 'static,
    K::DynamicType: Eq + std::hash::Hash + Clone,
{
    stopped(stop).await;
    if futures::FutureExt::now_or_never(cache.wait_until_ready()).is_none() {
        return;
    }
    std::future::pending::<()>().await;
}

/// Each controller's limits: at most `settings.concurrency` reconciles at once. Unbounded, a
/// fleet's worth of looks ran together, each holding its Talos connection's buffers and its
/// reconcile's state (`docs/benchmarks/fleet.md`).
fn limits(ctx: &Context) -> kube::runtime::controller::Config {
    kube::runtime::controller::Config::default().concurrency(ctx.settings.concurrency)
}

/// The TalosCluster controller: a machine's change, or a class's (which may approve pending
/// machines), reconciles its cluster.
async fn cluster_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let controller = Controller::new(
        Api::<TalosCluster>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(limits(&ctx))
    .watches(
        Api::<TalosMachine>::all(client.clone()),
        watcher::Config::default(),
        |m: TalosMachine| Some(cluster_of(m.namespace(), &m.spec.cluster_ref.name)),
    )
    .watches(
        Api::<ichor_api::TalosMachineClass>::all(client),
        watcher::Config::default(),
        |c: ichor_api::TalosMachineClass| Some(cluster_of(c.namespace(), &c.spec.cluster_ref.name)),
    );
    drive(
        controllers::CLUSTER,
        controller,
        cluster::reconcile,
        ctx,
        stop,
    )
    .await;
}

/// Every TalosMachine, watched and cached in `writer` as `Controller::new` would, their managed
/// fields slimmed to what a status write reads (ADR 0039). A machine deleted without a finalizer
/// (a pending one) leaves no reconcile behind: each delete the watch sees goes to a task that
/// releases that machine's claims (ADR 0054).
fn watched_machines(
    client: &kube::Client,
    writer: kube::runtime::reflector::store::Writer<TalosMachine>,
) -> impl futures::Stream<Item = Result<TalosMachine, watcher::Error>> + Send + use<> {
    let (deleted, released) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(claims::release_deleted(client.clone(), released));
    watcher(
        Api::<TalosMachine>::all(client.clone()),
        watcher::Config::default(),
    )
    .modify(status::slim)
    .reflect(writer)
    .inspect(move |event| {
        if let Ok(watcher::Event::Delete(machine)) = event {
            let _ = deleted.send(machine.clone());
        }
    })
    .applied_objects()
}

/// The TalosMachine controller: a change of its cluster (patches, versions), of a class or of
/// a storage of its cluster (patches, volumes) re-renders each machine of that cluster; a
/// machine whose drift turn ends, or that becomes Ready, wakes the machines queued behind it.
async fn machine_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let client = ctx.client.clone();
    // The machines as Controller::new would watch and cache them, with their managed fields
    // slimmed to what a status write reads (ADR 0039).
    let (cache, writer) = kube::runtime::reflector::store();
    let machines = watched_machines(&client, writer);
    let controller = Controller::for_stream(machines, cache).with_config(limits(&ctx));
    // The machine gauge is counted from this cache at scrape time: a deleted machine leaves
    // it, so it leaves the gauge.
    ctx.metrics.watch_machines(controller.store());
    let (by_cluster, by_class, by_storage) =
        (controller.store(), controller.store(), controller.store());
    let woken = Woken::default();
    let (wake_c, wake_m, wake_s) = (Arc::clone(&ctx), Arc::clone(&ctx), Arc::clone(&ctx));
    let controller = controller
        // The looks one machine asks of others: the end of a drift turn wakes the machines
        // queued behind it (ADR 0043).
        .reconcile_on(ctx.looks.asked())
        .watches(
            Api::<TalosCluster>::all(client.clone()),
            watcher::Config::default(),
            move |c: TalosCluster| {
                if !woken.again(&c) {
                    return Vec::new();
                }
                wake_c.woke(machines_of(&by_cluster, c.namespace(), &c.name_any()))
            },
        )
        .watches(
            Api::<ichor_api::TalosMachineClass>::all(client.clone()),
            watcher::Config::default(),
            move |c: ichor_api::TalosMachineClass| {
                wake_m.woke(machines_of(
                    &by_class,
                    c.namespace(),
                    &c.spec.cluster_ref.name,
                ))
            },
        )
        .watches(
            Api::<ichor_api::TalosStorage>::all(client),
            watcher::Config::default(),
            move |s: ichor_api::TalosStorage| {
                wake_s.woke(machines_of(
                    &by_storage,
                    s.namespace(),
                    &s.spec.cluster_ref.name,
                ))
            },
        );
    drive(
        controllers::MACHINE,
        controller,
        machine::reconcile,
        ctx,
        stop,
    )
    .await;
}

/// The TalosStorage controller: a machine's change (configured, ready, relabelled) may change
/// what a storage of its cluster selects and observes.
async fn storage_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let client = ctx.client.clone();
    let cache = Arc::clone(&ctx);
    let controller = Controller::new(
        Api::<ichor_api::TalosStorage>::all(client.clone()),
        watcher::Config::default(),
    )
    .with_config(limits(&ctx))
    .watches(
        Api::<TalosMachine>::all(client),
        watcher::Config::default(),
        move |m: TalosMachine| {
            cache
                .layers
                .storages()
                .into_iter()
                .filter(|s| {
                    s.namespace() == m.namespace()
                        && s.spec.cluster_ref.name == m.spec.cluster_ref.name
                })
                .map(|s| ObjectRef::from_obj(&*s))
                .collect::<Vec<_>>()
        },
    );
    drive(
        controllers::STORAGE,
        controller,
        storage::reconcile,
        ctx,
        stop,
    )
    .await;
}

/// The backup controller: each TalosCluster with `spec.backup`, reconciled when it changes and
/// when its next backup is due.
async fn backup_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let controller = Controller::new(
        Api::<TalosCluster>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .with_config(limits(&ctx));
    drive(
        controllers::BACKUP,
        controller,
        backup::reconcile,
        ctx,
        stop,
    )
    .await;
}

/// The TalosOperation controller.
async fn operation_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    let controller = Controller::new(
        Api::<TalosOperation>::all(ctx.client.clone()),
        watcher::Config::default(),
    )
    .with_config(limits(&ctx));
    drive(
        controllers::OPERATION,
        controller,
        operation::reconcile,
        ctx,
        stop,
    )
    .await;
}

/// Runs `work` until it ends or the manager stops.
async fn until_stopped(
    work: impl std::future::Future<Output = ()>,
    stop: tokio::sync::watch::Receiver<bool>,
) {
    tokio::select! {
        () = work => {}
        () = stopped(stop) => {}
    }
}

/// Runs the controllers until `shutdown` resolves, each (and each background watch) as a task
/// of its own: one that stops before is logged and fails `ctx.health` (`tasks`); the others
/// go on. Talos API calls made meanwhile are timed into `ctx.metrics` (the process-wide
/// observer of `ichor_talos::client::observe`, installed by the first `run`).
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let metrics = Arc::clone(&ctx.metrics);
    ichor_talos::client::observe(Arc::new(move |rpc| metrics.talos_rpc(rpc)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut tasks = tasks::Tasks::new(Arc::clone(&ctx.health), stop_rx.clone());
    for (name, watch) in ctx.layers.watches(&ctx.client) {
        tasks.spawn(name, until_stopped(watch, stop_rx.clone()));
    }
    let named = |controller: &str| format!("controller {controller}");
    tasks.spawn(
        named(controllers::CLUSTER),
        cluster_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::MACHINE),
        machine_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::STORAGE),
        storage_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::BACKUP),
        backup_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::OPERATION),
        operation_controller(ctx, stop_rx),
    );
    tasks.watch().await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_manager_told_to_stop_before_its_caches_filled_stops() {
        // Nothing answers: no controller's cache ever fills.
        let ctx = Arc::new(Context::nowhere(Settings::default()));
        let health = Arc::clone(&ctx.health);
        tokio::time::timeout(Duration::from_secs(30), run(ctx, async {}))
            .await
            .expect("every controller ended");
        assert!(health.failures().is_empty(), "{:?}", health.failures());
    }

    #[tokio::test]
    async fn a_panicked_reconcile_is_retried_after_its_backoff() {
        let ctx = Arc::new(Context::nowhere(Settings::default()));
        let cluster = Arc::new(TalosCluster::test("lab").namespace("a").build());
        let error = Error::Panicked {
            controller: controllers::CLUSTER,
            message: "overflow".into(),
            retry: Duration::from_secs(8),
        };
        assert_eq!(
            error_policy(cluster, &error, Arc::clone(&ctx)),
            Action::requeue(Duration::from_secs(8))
        );
        assert!(
            ctx.metrics
                .render()
                .contains("ichor_reconcile_errors_total{reason=\"ReconcilePanicked\"} 1")
        );
    }
}
