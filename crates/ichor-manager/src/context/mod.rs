//! What every reconcile shares ([`Context`]): the client, the settings, the clock and metrics,
//! the one watch of each kind several controllers read (TalosMachines, TalosClusters), and the
//! manager's in-memory caches (backoffs, panicked objects, sweeps, looks, backups in flight,
//! and its own credentials, [`credentials`]).

pub(crate) mod credentials;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use futures::StreamExt as _;
use futures::future::BoxFuture;
use ichor_api::{TalosCluster, TalosMachine, TalosNamespacePolicy};
use ichor_service::Health;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use kube::api::Api;
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use kube::runtime::reflector::ObjectRef;
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Resource, ResourceExt as _};

use crate::controller::{backup, machine};
use crate::infra::clock::{Clock, SystemClock};
use crate::infra::metrics::Metrics;
use crate::infra::shared::Shared;
use crate::infra::{panics, status};
use crate::{Error, Settings, claims, error, layers};

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
    pub(crate) backoff: error::Backoff,
    /// The objects whose reconciles panicked, and until when each waits.
    pub(crate) panics: panics::Panics,
    /// What `/healthz` reports: a controller that stops fails it.
    pub health: Arc<Health>,
    /// The manager's own short-lived credentials, per cluster.
    own: credentials::Cache,
    /// The machine classes and storages configs render from (watch caches).
    pub layers: layers::Layers,
    /// The clusters with a backup running (one at a time per cluster).
    pub(crate) backups: backup::InFlight,
    /// The fresh backups rollouts ask of the backup controller (ADR 0075).
    pub(crate) fresh_backups: backup::FreshAsks,
    /// The machines whose BMC is being read now (issue 42: one read each, in a task).
    pub(crate) bmc_reads: machine::bmc::Reading,
    /// The last look at each machine in progress (echoes of its own writes wait).
    pub looks: machine::Looks,
    /// Discovery's probes in flight, shared by every sweep: the sweep concurrency bounds them
    /// manager-wide, not per cluster.
    pub(crate) probes: Arc<tokio::sync::Semaphore>,
    /// Every TalosMachine, watched once for the machine, cluster and storage controllers.
    pub(crate) machines: Shared<TalosMachine>,
    /// Every TalosCluster, watched once for the cluster, machine and backup controllers.
    pub(crate) clusters: Shared<TalosCluster>,
    /// Ichor's cluster Secrets as last read, kept while their watched metadata says unchanged.
    pub(crate) secrets: crate::secrets::Cache,
    /// Every TalosNamespacePolicy, watched once for the looks at configured machines (ADR 0062).
    pub(crate) policies: Shared<TalosNamespacePolicy>,
    /// The schematics registered with an Image Factory (ADR 0067).
    pub(crate) factories: crate::factory::Registered,
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
            own: credentials::Cache::default(),
            layers: layers::Layers::default(),
            backups: backup::InFlight::default(),
            fresh_backups: backup::FreshAsks::default(),
            bmc_reads: machine::bmc::Reading::default(),
            looks: machine::Looks::default(),
            probes,
            machines: Shared::default(),
            clusters: Shared::default(),
            secrets: crate::secrets::Cache::default(),
            policies: Shared::default(),
            factories: crate::factory::Registered::default(),
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
    pub(crate) fn woke(
        &self,
        machines: Vec<ObjectRef<TalosMachine>>,
    ) -> Vec<ObjectRef<TalosMachine>> {
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
        let due = crate::controller::cluster::discovery::sweep_due(
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

/// How long a read of the shared caches waits for them to be filled at start.
const FILLED_WITHIN: Duration = Duration::from_secs(30);

impl Context {
    /// The shared watches (`machines`, `clusters`, and the metadata of Ichor's cluster
    /// Secrets, `secrets::Cache`), by name, for the caller to run as long as the manager does
    /// (`crate::infra::tasks`); a second call returns none. The machines are cached without
    /// their managed fields, which nothing reads (ADR 0039, 0061). A machine deleted without a finalizer (a pending one)
    /// leaves no reconcile behind: each delete the watch sees goes to a task that releases that
    /// machine's claims (ADR 0054).
    pub(crate) fn shared_watches(&self) -> Vec<(&'static str, BoxFuture<'static, ()>)> {
        let client = &self.client;
        let (deleted, released) = tokio::sync::mpsc::unbounded_channel();
        let machines = watcher(
            Api::<TalosMachine>::all(client.clone()),
            watcher::Config::default(),
        )
        .modify(status::slim)
        .inspect(move |event| {
            if let Ok(watcher::Event::Delete(machine)) = event {
                let _ = deleted.send(machine.clone());
            }
        });
        let clusters = watcher(
            Api::<TalosCluster>::all(client.clone()),
            watcher::Config::default(),
        );
        let mut watches = Vec::new();
        if let Some(watch) = self.machines.watch(machines) {
            tokio::spawn(claims::release_deleted(client.clone(), released));
            watches.push(("watch TalosMachine", watch));
        }
        if let Some(watch) = self.clusters.watch(clusters) {
            watches.push(("watch TalosCluster", watch));
        }
        if let Some(watch) = self.secrets.watch(client) {
            watches.push(("watch Secret metadata", watch));
        }
        let policies = watcher(
            Api::<TalosNamespacePolicy>::all(client.clone()),
            watcher::Config::default(),
        );
        if let Some(watch) = self.policies.watch(policies) {
            watches.push(("watch TalosNamespacePolicy", watch));
        }
        watches
    }
}

/// The TalosCluster `name` of `namespace` from the shared cluster cache (`Context::clusters`,
/// once it is filled): what the watch last saw of it.
pub(crate) async fn cached_cluster(
    ctx: &Context,
    namespace: &str,
    name: &str,
) -> Result<Option<TalosCluster>, Error> {
    let cache = ctx.clusters.store();
    filled(&cache, "the TalosCluster cache is not filled yet").await?;
    let key = ObjectRef::<TalosCluster>::new(name).within(namespace);
    Ok(cache.get(&key).map(|c| (*c).clone()))
}

/// `namespace`'s TalosNamespacePolicy from the shared cache (once it is filled), if it has one.
pub(crate) async fn cached_policy(
    ctx: &Context,
    namespace: &str,
) -> Result<Option<Arc<TalosNamespacePolicy>>, Error> {
    let cache = ctx.policies.store();
    filled(&cache, "the TalosNamespacePolicy cache is not filled yet").await?;
    Ok(cache.get(&ObjectRef::new(namespace)))
}

/// Waits (at most [`FILLED_WITHIN`]) for `cache` to be filled; `NotSynced` (`what`) if not.
async fn filled<K>(
    cache: &kube::runtime::reflector::Store<K>,
    what: &'static str,
) -> Result<(), Error>
where
    K: Resource<DynamicType = ()> + Clone + 'static,
{
    match tokio::time::timeout(FILLED_WITHIN, cache.wait_until_ready()).await {
        Ok(Ok(())) => Ok(()),
        _ => Err(Error::NotSynced(what)),
    }
}

/// Every TalosMachine of `cluster` (they live in its namespace), from the shared machine cache
/// (`Context::machines`, once it is filled): what the watch last saw of each, which can be a
/// moment behind the apiserver. A decision a safety rule guards reads
/// [`cluster_machines_as_stored`] instead, and names its rule.
pub async fn cluster_machines(
    ctx: &Context,
    cluster: &TalosCluster,
) -> Result<Vec<TalosMachine>, Error> {
    let cache = ctx.machines.store();
    filled(&cache, "the TalosMachine cache is not filled yet").await?;
    let (namespace, name) = (cluster.namespace(), cluster.name_any());
    Ok(cache
        .state()
        .into_iter()
        .filter(|m| m.spec.cluster_ref.name == name && m.namespace() == namespace)
        .map(|m| (*m).clone())
        .collect())
}

/// Every TalosMachine of `cluster` (they live in its namespace), as stored now: a list the
/// apiserver filters by `spec.clusterRef.name`, so a cluster's reconcile reads its own machines,
/// not the fleet's (ADR 0029). An apiserver without CRD field selectors (before Kubernetes
/// 1.31) refuses the selector; the namespace is then listed whole. Either way the machines are
/// checked against the cluster here too.
pub async fn cluster_machines_as_stored(
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
