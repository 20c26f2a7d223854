//! The machine classes and storages a machine's config is rendered from beyond its cluster and
//! itself (class patches, user volumes), watched once for the whole manager: a reconcile reads
//! them from the cache, never with a request of its own.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use futures::future::BoxFuture;
use futures::{FutureExt as _, StreamExt as _};
use ichor_api::machine::KubernetesComponents;
use ichor_api::versions::oldest_running;
use ichor_api::{TalosCluster, TalosMachine, TalosMachineClass, TalosStorage};
use ichor_render::{MachineLayers, RenderError};
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::reflector::{self, Store, store::Writer};
use kube::runtime::{WatchStreamExt as _, watcher};

/// The caches of every TalosMachineClass and TalosStorage, filled by [`Layers::watches`].
pub struct Layers {
    classes: Store<TalosMachineClass>,
    storages: Store<TalosStorage>,
    writers: Mutex<Option<(Writer<TalosMachineClass>, Writer<TalosStorage>)>>,
}

impl Default for Layers {
    fn default() -> Self {
        let (classes, class_writer) = reflector::store();
        let (storages, storage_writer) = reflector::store();
        Self {
            classes,
            storages,
            writers: Mutex::new(Some((class_writer, storage_writer))),
        }
    }
}

impl std::fmt::Debug for Layers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Layers").finish_non_exhaustive()
    }
}

impl Layers {
    /// The two watches that fill the caches, by name, for the caller to run as long as the
    /// manager does (`crate::infra::tasks`); a second call returns none.
    pub fn watches(&self, client: &kube::Client) -> Vec<(&'static str, BoxFuture<'static, ()>)> {
        let Some((class_writer, storage_writer)) =
            self.writers.lock().ok().and_then(|mut w| w.take())
        else {
            return Vec::new();
        };
        let classes: Api<TalosMachineClass> = Api::all(client.clone());
        let storages: Api<TalosStorage> = Api::all(client.clone());
        vec![
            (
                "watch TalosMachineClass",
                reflector::reflector(class_writer, watcher(classes, watcher::Config::default()))
                    .default_backoff()
                    .for_each(|_| async {})
                    .boxed(),
            ),
            (
                "watch TalosStorage",
                reflector::reflector(
                    storage_writer,
                    watcher(storages, watcher::Config::default()),
                )
                .default_backoff()
                .for_each(|_| async {})
                .boxed(),
            ),
        ]
    }

    /// What the caches hold, once each has a full list (a render never goes without a class's
    /// patches or a storage's volumes because the cache was not filled yet).
    pub async fn sources(&self) -> Result<Sources, crate::error::Error> {
        let ready = async {
            self.classes.wait_until_ready().await.is_ok()
                && self.storages.wait_until_ready().await.is_ok()
        };
        match tokio::time::timeout(std::time::Duration::from_secs(30), ready).await {
            Ok(true) => Ok(Sources {
                classes: self.classes.state(),
                storages: self.storages.state(),
                oldest_running: BTreeMap::new(),
                held: BTreeMap::new(),
            }),
            _ => Err(crate::error::Error::NotSynced(
                "the TalosMachineClass and TalosStorage caches are not filled yet",
            )),
        }
    }

    /// The cached classes (for mapping watch events to objects).
    pub fn classes(&self) -> Vec<Arc<TalosMachineClass>> {
        self.classes.state()
    }

    /// The cached storages (for mapping watch events to objects).
    pub fn storages(&self) -> Vec<Arc<TalosStorage>> {
        self.storages.state()
    }
}

/// The classes and storages at one moment.
#[derive(Debug, Clone, Default)]
pub struct Sources {
    /// Every TalosMachineClass.
    pub classes: Vec<Arc<TalosMachineClass>>,
    /// Every TalosStorage.
    pub storages: Vec<Arc<TalosStorage>>,
    /// The oldest Talos a configured node runs, by cluster (namespace, name): a config's
    /// contract never runs ahead of it (talos-facts §9.9). Empty unless [`Sources::running`]
    /// filled it.
    pub oldest_running: BTreeMap<(String, String), String>,
    /// The Kubernetes component versions a rollout holds machines at, by (namespace, machine
    /// name) (ADR 0070). Empty unless [`Sources::stepping`] filled it.
    pub held: BTreeMap<(String, String), KubernetesComponents>,
}

impl Sources {
    /// The layers `machine` renders with (its class, its volumes, the oldest Talos its
    /// cluster's nodes run), or why not.
    pub fn layers_for(&self, machine: &TalosMachine) -> Result<MachineLayers<'_>, RenderError> {
        let mut layers = MachineLayers::of(
            machine,
            self.classes.iter().map(AsRef::as_ref),
            self.storages.iter().map(AsRef::as_ref),
        )?;
        let cluster = (
            machine.namespace().unwrap_or_default(),
            machine.spec.cluster_ref.name.clone(),
        );
        layers.oldest_running = self.oldest_running.get(&cluster).map(String::as_str);
        layers.kubernetes = self.held.get(&(cluster.0, machine.name_any()));
        Ok(layers)
    }

    /// The same sources, with the oldest Talos the configured nodes of `machine`'s cluster
    /// run, as `machines` record it (`ichor_api::versions::oldest_running`).
    #[must_use]
    pub fn running(mut self, machines: &[Arc<TalosMachine>], machine: &TalosMachine) -> Self {
        let namespace = machine.namespace().unwrap_or_default();
        let cluster = machine.spec.cluster_ref.name.clone();
        let oldest = oldest_running(machines.iter().map(AsRef::as_ref), &namespace, &cluster);
        if let Some((text, _)) = oldest {
            self.oldest_running
                .insert((namespace, cluster), text.to_owned());
        }
        self
    }

    /// The same sources, with the Kubernetes component versions each machine of `machine`'s
    /// cluster is held at while the cluster rolls out a Kubernetes version (the accepted one,
    /// from `kubernetesFrom`), step by step (ADR 0070), from what `machines` were seen running:
    /// every machine's, since the drift rollout's turns render the others' configs too.
    #[must_use]
    pub fn stepping(
        mut self,
        cluster: &TalosCluster,
        machines: &[Arc<TalosMachine>],
        machine: &TalosMachine,
    ) -> Self {
        let Some(accepted) = cluster
            .status
            .as_ref()
            .and_then(|s| s.core.accepted_versions.as_ref())
        else {
            return self;
        };
        let Some(from) = accepted.kubernetes_from.as_deref() else {
            return self;
        };
        let namespace = machine.namespace().unwrap_or_default();
        let members = crate::kubernetes_steps::members(
            machines.iter().map(AsRef::as_ref),
            &namespace,
            &machine.spec.cluster_ref.name,
        );
        let mut names: Vec<&str> = members.iter().map(|m| m.name).collect();
        let me = machine.name_any();
        if !names.contains(&me.as_str()) {
            names.push(&me);
        }
        for name in names {
            let held = crate::kubernetes_steps::components(
                &accepted.kubernetes_version,
                from,
                &members,
                name,
            );
            self.held.insert((namespace.clone(), name.to_owned()), held);
        }
        self
    }
}
