//! The manager's Prometheus metrics (`prometheus-client`): reconciles, their durations and
//! errors, and those that panicked; Talos RPC latency; machines by namespace and phase,
//! computed at scrape time from the machine controller's cache so that deleted machines vanish
//! by construction; whether this replica leads. Served by `ichor_service::serve` (see
//! [`crate::infra::http`]).

use std::sync::{Arc, RwLock};
use std::time::Duration;

use ichor_api::{TalosCluster, TalosMachine};
use ichor_service::Registry;
use kube::ResourceExt as _;
use kube::runtime::reflector::Store;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeLabelSet, EncodeMetric as _};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};

/// A kind label (`TalosCluster`, `TalosMachine`, `TalosOperation`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabel {
    kind: String,
}

/// A controller label (`ichor_api::names::controllers`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ControllerLabel {
    controller: String,
}

/// A failure reason label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabel {
    reason: String,
}

/// The labels of a Talos RPC: gRPC service and method, and the result code.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    service: String,
    method: String,
    code: String,
}

/// A cluster's labels.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterLabels {
    namespace: String,
    cluster: String,
}

/// A cluster's labels and a failure reason.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ClusterReasonLabels {
    namespace: String,
    cluster: String,
    reason: String,
}

/// Backups take seconds to tens of minutes.
fn backup_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.5, 2.0, 14))
}

/// The labels of the machine gauge.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PhaseLabels {
    namespace: String,
    phase: String,
}

type Histograms<L> = Family<L, Histogram, fn() -> Histogram>;

/// Reconciles take milliseconds to tens of seconds (a bootstrap waits for the node).
fn reconcile_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 14))
}

/// Talos calls take milliseconds to the 30 s request limit.
fn rpc_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.002, 2.0, 15))
}

/// Machines by namespace and phase, counted from the machine controller's cache at each
/// scrape; nothing is reported before [`Metrics::watch_machines`] hands the cache over.
#[derive(Default)]
struct MachinePhases {
    store: RwLock<Option<Store<TalosMachine>>>,
}

impl std::fmt::Debug for MachinePhases {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MachinePhases").finish_non_exhaustive()
    }
}

impl MachinePhases {
    fn counts(&self) -> Family<PhaseLabels, Gauge> {
        let family = Family::<PhaseLabels, Gauge>::default();
        let machines = self
            .store
            .read()
            .ok()
            .and_then(|s| s.as_ref().map(Store::state))
            .unwrap_or_default();
        for machine in machines {
            let phase = machine
                .status
                .as_ref()
                .map(|s| s.lifecycle.phase)
                .unwrap_or_default();
            family
                .get_or_create(&PhaseLabels {
                    namespace: machine.namespace().unwrap_or_default(),
                    phase: format!("{phase:?}"),
                })
                .inc();
        }
        family
    }
}

impl Collector for MachinePhases {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let family = self.counts();
        let metric = encoder.encode_descriptor(
            "ichor_machines",
            "TalosMachines by namespace and phase.",
            None,
            family.metric_type(),
        )?;
        family.encode(metric)
    }
}

fn cluster_labels(cluster: &TalosCluster) -> ClusterLabels {
    ClusterLabels {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
    }
}

/// The manager's metrics, registered in one registry.
#[derive(Debug)]
pub struct Metrics {
    registry: Arc<Registry>,
    reconcile: ReconcileFamilies,
    rpcs: Histograms<RpcLabels>,
    leader: Gauge,
    machines: Arc<MachinePhases>,
    backups: BackupMetrics,
}

/// The backup metrics: durations, sizes and failures, by cluster.
#[derive(Debug)]
struct BackupMetrics {
    durations: Histograms<ClusterLabels>,
    sizes: Family<ClusterLabels, Gauge>,
    failures: Family<ClusterReasonLabels, Counter>,
}

impl BackupMetrics {
    fn register(r: &mut Registry) -> Self {
        Self {
            durations: registered(
                r,
                "ichor_backup_duration_seconds",
                "How long successful etcd backups took, by cluster.",
                Family::new_with_constructor(backup_buckets as fn() -> Histogram),
            ),
            sizes: registered(
                r,
                "ichor_backup_size_bytes",
                "The size of the last successful etcd backup (before encryption), by cluster.",
                Family::default(),
            ),
            failures: registered(
                r,
                "ichor_backup_failures",
                "Failed etcd backups, by cluster and reason.",
                Family::default(),
            ),
        }
    }
}

/// `metric` registered in `registry` as `name` with `help`; returns it (a handle to the same
/// values).
fn registered<M>(registry: &mut Registry, name: &str, help: &str, metric: M) -> M
where
    M: prometheus_client::registry::Metric + Clone,
{
    registry.register(name, help, metric.clone());
    metric
}

/// The reconcile metrics, registered together.
#[derive(Debug)]
struct ReconcileFamilies {
    reconciles: Family<KindLabel, Counter>,
    skipped: Family<KindLabel, Counter>,
    durations: Histograms<KindLabel>,
    errors: Family<ReasonLabel, Counter>,
    panics: Family<ControllerLabel, Counter>,
    waiting: Family<ControllerLabel, Gauge>,
}

impl ReconcileFamilies {
    fn register(r: &mut Registry) -> Self {
        let reconciles = registered(
            r,
            "ichor_reconciles",
            "Reconciles by kind.",
            Family::default(),
        );
        let skipped = registered(
            r,
            "ichor_reconciles_skipped",
            "Reconciles that were only the echo of an object's own last look and waited for its due time (nothing read or written), by kind.",
            Family::default(),
        );
        let durations = registered(
            r,
            "ichor_reconcile_duration_seconds",
            "How long reconciles take, by kind.",
            Family::new_with_constructor(reconcile_buckets as fn() -> Histogram),
        );
        let errors = registered(
            r,
            "ichor_reconcile_errors",
            "Failed reconciles by reason.",
            Family::default(),
        );
        let panics = registered(
            r,
            "ichor_reconcile_panics",
            "Reconciles that panicked (caught, and retried with a growing backoff), by controller.",
            Family::default(),
        );
        let waiting = registered(
            r,
            "ichor_reconciles_waiting",
            "Reconciles due but waiting for their turn (every place of --concurrent-reconciles taken), by controller.",
            Family::default(),
        );
        Self {
            reconciles,
            skipped,
            durations,
            errors,
            panics,
            waiting,
        }
    }
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::default();
        let r = &mut registry;
        let reconcile = ReconcileFamilies::register(r);
        let rpcs = registered(
            r,
            "ichor_talos_rpc_duration_seconds",
            "How long Talos API calls take (to the reply's headers), by service, method and gRPC code.",
            Family::new_with_constructor(rpc_buckets as fn() -> Histogram),
        );
        let leader = registered(
            r,
            "ichor_leader",
            "Whether this replica leads (1) or stands by (0).",
            Gauge::default(),
        );
        let machines = Arc::new(MachinePhases::default());
        registry.register_collector(Box::new(Arc::clone(&machines)));
        let backups = BackupMetrics::register(&mut registry);
        Self {
            registry: Arc::new(registry),
            reconcile,
            rpcs,
            leader,
            machines,
            backups,
        }
    }
}

impl Metrics {
    /// Counts one reconcile of `kind` that took `took`.
    pub fn reconciled(&self, kind: &str, took: Duration) {
        let label = KindLabel {
            kind: kind.to_owned(),
        };
        self.reconcile.reconciles.get_or_create(&label).inc();
        self.reconcile
            .durations
            .get_or_create(&label)
            .observe(took.as_secs_f64());
    }

    /// Counts one reconcile of `kind` skipped as an echo of the object's own last look.
    pub fn skipped(&self, kind: &str) {
        self.reconcile
            .skipped
            .get_or_create(&KindLabel {
                kind: kind.to_owned(),
            })
            .inc();
    }

    /// The gauge of `controller`'s reconciles waiting for their turn (`infra::drive::Turns`).
    pub fn waiting(&self, controller: &str) -> Gauge {
        self.reconcile
            .waiting
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .clone()
    }

    /// Counts one failed reconcile by reason.
    pub fn error(&self, reason: &str) {
        self.reconcile
            .errors
            .get_or_create(&ReasonLabel {
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Counts one reconcile of `controller` that panicked.
    pub fn reconcile_panicked(&self, controller: &str) {
        self.reconcile
            .panics
            .get_or_create(&ControllerLabel {
                controller: controller.to_owned(),
            })
            .inc();
    }

    /// Records a successful backup of `cluster`.
    pub fn backup_succeeded(&self, cluster: &TalosCluster, seconds: f64, size: i64) {
        let labels = cluster_labels(cluster);
        self.backups
            .durations
            .get_or_create(&labels)
            .observe(seconds);
        self.backups.sizes.get_or_create(&labels).set(size);
    }

    /// Counts a failed backup of `cluster`.
    pub fn backup_failed(&self, cluster: &TalosCluster, reason: &str) {
        let ClusterLabels { namespace, cluster } = cluster_labels(cluster);
        self.backups
            .failures
            .get_or_create(&ClusterReasonLabels {
                namespace,
                cluster,
                reason: reason.to_owned(),
            })
            .inc();
    }

    /// Records one Talos API call (see `ichor_talos::client::observe`).
    pub fn talos_rpc(&self, rpc: &ichor_talos::client::Rpc<'_>) {
        self.rpcs
            .get_or_create(&RpcLabels {
                service: rpc.service.to_owned(),
                method: rpc.method.to_owned(),
                code: format!("{:?}", rpc.code),
            })
            .observe(rpc.took.as_secs_f64());
    }

    /// Records whether this replica leads.
    pub fn set_leading(&self, leading: bool) {
        self.leader.set(i64::from(leading));
    }

    /// Counts machines by phase from `store` (the machine controller's cache) at each scrape.
    pub fn watch_machines(&self, store: Store<TalosMachine>) {
        if let Ok(mut slot) = self.machines.store.write() {
            *slot = Some(store);
        }
    }

    /// How many machines the watched cache holds (none before [`Metrics::watch_machines`]).
    pub fn machines(&self) -> usize {
        self.machines
            .store
            .read()
            .ok()
            .and_then(|slot| slot.as_ref().map(Store::len))
            .unwrap_or(0)
    }

    /// Kept for the reconcilers that report a phase change: the machine gauge is read from
    /// the cache at scrape time ([`Metrics::watch_machines`]), so this records nothing.
    pub fn phase(&self, _machine: &str, _phase: ichor_api::machine::MachinePhase) {}

    /// The registry holding all of the above, for the HTTP endpoint.
    pub fn registry(&self) -> Arc<Registry> {
        Arc::clone(&self.registry)
    }

    /// The text exposition (Prometheus text format).
    pub fn render(&self) -> String {
        ichor_service::render(&self.registry)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kube::runtime::reflector;
    use kube::runtime::watcher::Event;

    fn machine(namespace: &str, name: &str) -> TalosMachine {
        let mut machine = TalosMachine::new(
            name,
            ichor_api::machine::TalosMachineSpec {
                cluster_ref: ichor_api::common::LocalObjectReference { name: "c".into() },
                role: None,
                approval_state: ichor_api::machine::ApprovalState::Pending,
                endpoints: Vec::new(),
                fingerprint: None,
                hostname: None,
                install: None,
                schematic: None,
                config_patches: Vec::new(),
                bmc: None,
            },
        );
        machine.metadata.namespace = Some(namespace.into());
        machine
    }

    #[test]
    fn machines_are_counted_by_namespace_and_vanish_once_deleted() {
        let (store, mut writer) = reflector::store::<TalosMachine>();
        let metrics = Metrics::default();
        metrics.watch_machines(store);
        let (a, b) = (machine("ns-a", "m1"), machine("ns-b", "m2"));
        writer.apply_watcher_event(&Event::Apply(a.clone()));
        writer.apply_watcher_event(&Event::Apply(b));
        let text = metrics.render();
        assert!(
            text.contains("ichor_machines{namespace=\"ns-a\",phase=\"Pending\"} 1"),
            "{text}"
        );
        assert!(
            text.contains("ichor_machines{namespace=\"ns-b\",phase=\"Pending\"} 1"),
            "{text}"
        );
        writer.apply_watcher_event(&Event::Delete(a));
        let text = metrics.render();
        assert!(!text.contains("namespace=\"ns-a\""), "{text}");
        assert!(text.contains("namespace=\"ns-b\""), "{text}");
    }

    #[test]
    fn panics_are_counted_by_controller() {
        let metrics = Metrics::default();
        metrics.reconcile_panicked("cluster");
        metrics.reconcile_panicked("cluster");
        metrics.reconcile_panicked("operation");
        let text = metrics.render();
        assert!(
            text.contains("ichor_reconcile_panics_total{controller=\"cluster\"} 2"),
            "{text}"
        );
        assert!(
            text.contains("ichor_reconcile_panics_total{controller=\"operation\"} 1"),
            "{text}"
        );
    }

    #[test]
    fn the_leader_gauge_follows_leadership() {
        let metrics = Metrics::default();
        assert!(metrics.render().contains("ichor_leader 0"));
        metrics.set_leading(true);
        assert!(metrics.render().contains("ichor_leader 1"));
    }
}
