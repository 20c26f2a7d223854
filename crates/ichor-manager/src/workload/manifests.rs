//! The bootstrap manifests synced into a workload cluster's API, as the last step of
//! `talosctl upgrade-k8s` does it for a cluster whose lowest Talos is 1.13 or later
//! (talos-facts §9.7, "Server-side apply sync"). A control plane only ever creates the objects
//! of its `Manifests.kubernetes.talos.dev` that are missing (talos-facts §14.4); updating them
//! (a new kube-proxy image, a new CoreDNS) is this sync's job.
//!
//! What it does, in Talos's order (go-kubernetes `kubernetes/ssa/apply.go` `Manager.Apply`,
//! fluxcd `pkg/ssa` `ApplyAllStaged`):
//!
//! 1. Every object is checked (`apiVersion`, `kind`, `metadata.name`) and annotated
//!    `config.k8s.io/owning-inventory: talos-bootstrap-manifests-inventory`; an object whose
//!    manifest names another inventory is refused before anything is written.
//! 2. The inventory ConfigMap `kube-system/talos-bootstrap-manifests-inventory` is read, or
//!    created empty (its namespace too).
//! 3. Each object's kind is resolved through discovery; one that exists and carries another
//!    inventory's annotation is refused before anything is written (talosctl's default
//!    inventory policy, `AdoptIfNoInventory`: objects without the annotation are taken over).
//! 4. Server-side apply (field manager `talos`, forced) in [`Stage`]s: CRDs, Namespaces and
//!    ClusterRoles (CRDs then waited for until established, and discovery run again, so a
//!    custom resource of a CRD created in the same sync resolves), `…Class` kinds, ConfigMaps
//!    and Secrets, then the rest; within a stage in fluxcd's kind order.
//! 5. The inventory records every applied object (also when an apply failed half way).
//! 6. Pruning: objects the inventory lists but the manifests no longer hold are deleted
//!    (propagation `Background`) and dropped from the inventory.
//!
//! Where this differs from Talos, on purpose: a namespaced object without a namespace goes to
//! `default`, as a control plane creates it (T `controllers/k8s/manifest_apply.go`); the
//! upgrade sync itself sends no namespace for it and fails. An inventory entry whose kind the
//! server no longer serves is dropped from the inventory instead of failing every sync. An
//! entry Talos 1.13 wrote for a cluster-scoped object with its manifest's namespace gives way
//! to the entry without one, as a control plane's own apply does (T
//! `controllers/k8s/manifest_apply.go`), so it is neither kept twice nor pruned. Whether an
//! apply changed an object is read from its `resourceVersion`; fluxcd decides it with a
//! dry-run first and skips the apply of an unchanged object, to the same effect.
//! Talos's 3-minute retry of retryable errors, its diff and its readiness wait of the changed
//! workloads are the caller's to do.
//!
//! Sources (T: `siderolabs/talos` v1.14.1, M: its `pkg/machinery` v1.14.1, G:
//! `siderolabs/go-kubernetes` v0.2.41, F: `fluxcd/pkg/ssa` v0.77.0, C: `fluxcd/cli-utils`
//! v1.2.2, the versions T's `go.mod` pins): T `pkg/cluster/kubernetes/talos_managed.go`
//! `syncManifestsSSA`; M `constants/constants.go`; G `kubernetes/ssa/apply.go`,
//! `inventory_policy.go`, `internal/inventory/configmap/inventory.go`; F `manager_apply.go`,
//! `sort.go`, `utils/is.go`; C `pkg/object/objmetadata.go`, `pkg/kstatus/status/core.go`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::fmt;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, DynamicObject, ObjectMeta, Patch, PatchParams, PostParams};
use kube::core::GroupVersionKind;
use kube::discovery::{ApiResource, Discovery, Scope};
use serde_json::{Map, Value};

/// The field manager Talos applies the bootstrap manifests with (M
/// `constants/constants.go` `KubernetesFieldManagerName`).
pub const FIELD_MANAGER: &str = "talos";
/// The namespace of the inventory ConfigMap (M `KubernetesInventoryNamespace`).
pub const INVENTORY_NAMESPACE: &str = "kube-system";
/// The inventory ConfigMap's name, also the inventory's ID in the owning annotation (M
/// `KubernetesBootstrapManifestsInventoryName`).
pub const INVENTORY_NAME: &str = "talos-bootstrap-manifests-inventory";
/// The annotation naming the inventory an object belongs to (G `InventoryAnnotationKey`).
pub const OWNING_INVENTORY: &str = "config.k8s.io/owning-inventory";

/// How long the CRDs of a sync get to become established: talosctl's default
/// `--manifests-reconcile-timeout`, the wait fluxcd's first stage is given.
const ESTABLISH_TIMEOUT: Duration = Duration::from_secs(300);
/// How often a CRD's conditions, or discovery of its kind, are read again.
const POLL: Duration = Duration::from_millis(500);
/// How long the kind of a CRD established in this sync may take to appear in discovery.
const DISCOVERY_TIMEOUT: Duration = Duration::from_secs(30);

/// The order Talos applies objects in: each stage is applied whole before the next.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Stage {
    /// CustomResourceDefinitions, Namespaces and ClusterRoles; CRDs are waited for.
    Definitions,
    /// Kinds whose name ends in `Class` (StorageClass, PriorityClass, …).
    Classes,
    /// ConfigMaps and Secrets, before the workloads that mount them (Talos's custom stage).
    Data,
    /// Everything else.
    Rest,
}

impl Stage {
    /// Every stage, in the order they are applied.
    pub const ALL: [Stage; 4] = [Stage::Definitions, Stage::Classes, Stage::Data, Stage::Rest];

    /// The stage of an object of `api_version` and `kind` (F `utils/is.go`
    /// `IsClusterDefinition`, `IsClassDefinition`; T's custom stage kinds).
    pub fn of(api_version: &str, kind: &str) -> Stage {
        let lower = kind.to_lowercase();
        let definition = (lower == "customresourcedefinition"
            && api_version.starts_with("apiextensions.k8s.io/"))
            || (lower == "namespace" && api_version == "v1")
            || (lower == "clusterrole" && api_version.starts_with("rbac.authorization.k8s.io/"));
        if definition {
            Stage::Definitions
        } else if kind.ends_with("Class") {
            Stage::Classes
        } else if group_of(api_version).is_empty() && (kind == "ConfigMap" || kind == "Secret") {
            Stage::Data
        } else {
            Stage::Rest
        }
    }
}

/// One object as the sync and its inventory name it: group, kind, namespace (empty for a
/// cluster-scoped object) and name, no version (C `ObjMetadata`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectId {
    /// The API group, empty for the core group.
    pub group: String,
    /// The kind.
    pub kind: String,
    /// The namespace, empty for a cluster-scoped object.
    pub namespace: String,
    /// The name.
    pub name: String,
}

/// The RBAC kinds, whose names may hold `:`, written `__` in an inventory key.
const RBAC_KINDS: [&str; 4] = ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"];

impl ObjectId {
    /// The inventory ConfigMap's key for this object: `<namespace>_<name>_<group>_<kind>`, a
    /// `:` in an RBAC object's name written `__` (C `ObjMetadata.String`).
    pub fn inventory_key(&self) -> String {
        let name = if self.group == "rbac.authorization.k8s.io"
            && RBAC_KINDS.contains(&self.kind.as_str())
        {
            self.name.replace(':', "__")
        } else {
            self.name.clone()
        };
        format!("{}_{name}_{}_{}", self.namespace, self.group, self.kind)
    }

    /// The object an inventory key names, if it has the four fields (C `ParseObjMetadata`:
    /// the namespace up to the first `_`, kind and group after the last two, `__` in the
    /// name read as `:` whatever the kind).
    pub fn from_inventory_key(key: &str) -> Option<ObjectId> {
        let (namespace, rest) = key.split_once('_')?;
        let (rest, kind) = rest.rsplit_once('_')?;
        let (name, group) = rest.rsplit_once('_')?;
        Some(ObjectId {
            group: group.to_owned(),
            kind: kind.to_owned(),
            namespace: namespace.to_owned(),
            name: name.replace("__", ":"),
        })
    }

    /// Whether this inventory entry is `object`: same group, kind and name, and the same
    /// namespace unless the entry has none (G `calculatePruneObjects`).
    fn listed_as(&self, object: &ObjectId) -> bool {
        self.group == object.group
            && self.kind == object.kind
            && self.name == object.name
            && (self.namespace == object.namespace || self.namespace.is_empty())
    }
}

impl fmt::Display for ObjectId {
    /// `<kind>/<namespace>/<name>`, or `<kind>/<name>` without a namespace (G `FormatMetaPath`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.namespace.is_empty() {
            write!(f, "{}/{}", self.kind, self.name)
        } else {
            write!(f, "{}/{}/{}", self.kind, self.namespace, self.name)
        }
    }
}

/// What an apply did to one object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Change {
    /// It did not exist.
    Created,
    /// It existed and changed (its `resourceVersion` moved).
    Configured,
    /// It existed and the apply changed nothing.
    Unchanged,
}

/// One object the sync applied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Applied {
    /// The stage it was applied in.
    pub stage: Stage,
    /// The object, its namespace as the server holds it.
    pub object: ObjectId,
    /// What the apply did.
    pub change: Change,
}

/// What a sync did: every object applied, in order, and every object pruned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Synced {
    /// The objects applied, stage by stage, in the order they were applied.
    pub applied: Vec<Applied>,
    /// The objects deleted because the manifests no longer hold them.
    pub pruned: Vec<ObjectId>,
}

impl Synced {
    /// The objects applied in `stage`.
    pub fn in_stage(&self, stage: Stage) -> impl Iterator<Item = &Applied> {
        self.applied.iter().filter(move |a| a.stage == stage)
    }

    /// How many objects were applied in `stage`.
    pub fn count(&self, stage: Stage) -> usize {
        self.in_stage(stage).count()
    }
}

/// Why a sync stopped; what was applied before stays applied, and recorded in the inventory.
#[derive(Debug, thiserror::Error)]
pub enum SyncError {
    /// An object of a manifest lacks what every object has.
    #[error("manifest {manifest}: object {index} {problem}")]
    Malformed {
        /// The manifest's ID, e.g. `10-kube-proxy`.
        manifest: String,
        /// The object's position in the manifest, from 0.
        index: usize,
        /// What is wrong, e.g. `has no kind`.
        problem: String,
    },
    /// The object, in its manifest or in the cluster, belongs to another inventory.
    #[error("{object} belongs to inventory {owner:?}, not {INVENTORY_NAME}")]
    ForeignInventory {
        /// The object.
        object: ObjectId,
        /// The inventory its `config.k8s.io/owning-inventory` annotation names.
        owner: String,
    },
    /// The API server does not serve the object's kind at its version.
    #[error("{object}: the API server does not serve {api_version} {}", .object.kind)]
    UnknownKind {
        /// The object.
        object: ObjectId,
        /// The object's `apiVersion`.
        api_version: String,
    },
    /// Reading the object, or its kind through discovery, failed.
    #[error("{object}: reading it failed: {}", answer(.source))]
    Read {
        /// The object.
        object: ObjectId,
        /// The API's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The API server refused the object's server-side apply.
    #[error("{object}: server-side apply refused: {}", answer(.source))]
    Apply {
        /// The object.
        object: ObjectId,
        /// The API's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// A CRD the sync applied did not become established.
    #[error("{object}: not established: {detail}")]
    NotEstablished {
        /// The CRD.
        object: ObjectId,
        /// Its failing condition, or how long it was waited for.
        detail: String,
    },
    /// Deleting an object the manifests no longer hold failed.
    #[error("{object}: pruning it failed: {}", answer(.source))]
    Prune {
        /// The object.
        object: ObjectId,
        /// The API's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// Reading or writing the inventory ConfigMap (or creating its namespace) failed.
    #[error("inventory {INVENTORY_NAMESPACE}/{INVENTORY_NAME}: {}", answer(.source))]
    Inventory {
        /// The API's error.
        #[source]
        source: Box<kube::Error>,
    },
    /// The inventory holds a key that does not name an object.
    #[error(
        "inventory {INVENTORY_NAMESPACE}/{INVENTORY_NAME}: key {key:?} is not <namespace>_<name>_<group>_<kind>"
    )]
    InventoryEntry {
        /// The key.
        key: String,
    },
}

/// The API server's answer in a sentence: code, reason and message of a refusal, else the
/// client's error.
fn answer(error: &kube::Error) -> String {
    match error {
        kube::Error::Api(status) => {
            format!("{} {}: {}", status.code, status.reason, status.message)
        }
        other => other.to_string(),
    }
}

/// The group of an `apiVersion`: before the `/`, empty for the core group's `v1`.
fn group_of(api_version: &str) -> &str {
    api_version.split_once('/').map_or("", |(group, _)| group)
}

/// One object of the manifests, checked and annotated, ready to apply.
#[derive(Debug, Clone)]
struct Prepared {
    /// Its GVK, from `apiVersion` and `kind`.
    gvk: GroupVersionKind,
    /// Its `apiVersion`.
    api_version: String,
    /// Its namespace as the manifest gives it (maybe empty).
    namespace: String,
    /// Its name.
    name: String,
    /// The stage it is applied in.
    stage: Stage,
    /// The object as it is applied.
    body: Value,
}

impl Prepared {
    /// The object as its manifest names it.
    fn id(&self) -> ObjectId {
        ObjectId {
            group: self.gvk.group.clone(),
            kind: self.gvk.kind.clone(),
            namespace: self.namespace.clone(),
            name: self.name.clone(),
        }
    }
}

/// A string field of an object: absent is `None`; present must be a non-empty string.
fn field<'a>(object: &'a Map<String, Value>, key: &str) -> Result<Option<&'a str>, String> {
    match object.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) if !s.is_empty() => Ok(Some(s)),
        Some(Value::String(_)) => Ok(None),
        Some(other) => Err(format!("has {key} {other}, not a string")),
    }
}

/// Checks one object and annotates it with the inventory (G `prepareObjects`).
fn prepare_one(manifest: &str, index: usize, object: &Value) -> Result<Prepared, SyncError> {
    let malformed = |problem: String| SyncError::Malformed {
        manifest: manifest.to_owned(),
        index,
        problem,
    };
    let mut body = object.clone();
    let top = body
        .as_object_mut()
        .ok_or_else(|| malformed("is not a JSON object".into()))?;
    let api_version = field(top, "apiVersion")
        .map_err(&malformed)?
        .ok_or_else(|| malformed("has no apiVersion".into()))?
        .to_owned();
    let kind = field(top, "kind")
        .map_err(&malformed)?
        .ok_or_else(|| malformed("has no kind".into()))?
        .to_owned();
    let metadata = top
        .entry("metadata")
        .or_insert_with(|| Value::Object(Map::new()))
        .as_object_mut()
        .ok_or_else(|| malformed("has a metadata that is not an object".into()))?;
    let name = field(metadata, "name")
        .map_err(|p| malformed(format!("{kind}: {p}")))?
        .ok_or_else(|| malformed(format!("{kind} has no metadata.name")))?
        .to_owned();
    let namespace = field(metadata, "namespace")
        .map_err(|p| malformed(format!("{kind} {name}: {p}")))?
        .unwrap_or_default()
        .to_owned();
    let (group, version) = api_version.split_once('/').unwrap_or(("", &api_version));
    let mut prepared = Prepared {
        gvk: GroupVersionKind::gvk(group, version, &kind),
        stage: Stage::of(&api_version, &kind),
        api_version,
        namespace,
        name,
        body: Value::Null,
    };
    prepared.body = body;
    annotate(&mut prepared).map_err(|problem| match problem {
        Some(problem) => malformed(format!("{kind} {}: {problem}", prepared.name)),
        None => SyncError::ForeignInventory {
            object: prepared.id(),
            owner: owner_of(&prepared.body),
        },
    })?;
    Ok(prepared)
}

/// The owning inventory a manifest's object names, as written there.
fn owner_of(body: &Value) -> String {
    let owner = &body["metadata"]["annotations"][OWNING_INVENTORY];
    owner
        .as_str()
        .map_or_else(|| owner.to_string(), str::to_owned)
}

/// Adds the inventory's annotation to the object; `Err(None)` if it names another
/// inventory, `Err(Some(problem))` if its annotations are not a map.
fn annotate(object: &mut Prepared) -> Result<(), Option<String>> {
    let annotations = &mut object.body["metadata"]["annotations"];
    if annotations.is_null() {
        *annotations = Value::Object(Map::new());
    }
    let annotations = annotations
        .as_object_mut()
        .ok_or_else(|| Some("annotations are not an object".to_owned()))?;
    match annotations.get(OWNING_INVENTORY) {
        Some(Value::String(owner)) if owner == INVENTORY_NAME => {}
        Some(_) => return Err(None),
        None => {}
    }
    annotations.insert(OWNING_INVENTORY.into(), INVENTORY_NAME.into());
    Ok(())
}

/// Fluxcd's kind order within a stage (F `sort.go` `ReconcileOrder`): the `FIRST` kinds in
/// their order, then every other kind, then the `LAST` ones.
fn kind_rank(kind: &str) -> i32 {
    const FIRST: [&str; 23] = [
        "CustomResourceDefinition",
        "Namespace",
        "ClusterRole",
        "ClusterClass",
        "RuntimeClass",
        "PriorityClass",
        "StorageClass",
        "VolumeSnapshotClass",
        "IngressClass",
        "GatewayClass",
        "ClusterRoleBinding",
        "ResourceQuota",
        "ServiceAccount",
        "Role",
        "RoleBinding",
        "ConfigMap",
        "Secret",
        "Service",
        "LimitRange",
        "Deployment",
        "StatefulSet",
        "CronJob",
        "PodDisruptionBudget",
    ];
    const LAST: [&str; 2] = [
        "MutatingWebhookConfiguration",
        "ValidatingWebhookConfiguration",
    ];
    let at = |list: &[&str]| list.iter().position(|k| *k == kind);
    if let Some(i) = at(&FIRST) {
        i as i32 - FIRST.len() as i32
    } else if let Some(i) = at(&LAST) {
        i as i32 + 1
    } else {
        0
    }
}

/// Every object of `manifests`, checked, annotated and sorted into the order they are
/// applied: by stage, then by kind (F `SortableUnstructureds`: rank, group, kind), namespace
/// and name.
fn prepare(manifests: &[ichor_talos::Manifest]) -> Result<Vec<Prepared>, SyncError> {
    let mut objects = Vec::new();
    for manifest in manifests {
        for (index, object) in manifest.objects.iter().enumerate() {
            objects.push(prepare_one(&manifest.id, index, object)?);
        }
    }
    objects.sort_by(|a, b| {
        (a.stage, kind_rank(&a.gvk.kind), &a.gvk.group, &a.gvk.kind)
            .cmp(&(b.stage, kind_rank(&b.gvk.kind), &b.gvk.group, &b.gvk.kind))
            .then_with(|| (&a.namespace, &a.name).cmp(&(&b.namespace, &b.name)))
    });
    Ok(objects)
}

/// The inventory's entries that no applied object is: what pruning deletes.
fn stale(inventory: &BTreeSet<ObjectId>, applied: &[Applied]) -> Vec<ObjectId> {
    inventory
        .iter()
        .filter(|entry| !applied.iter().any(|a| entry.listed_as(&a.object)))
        .cloned()
        .collect()
}

/// Whether `annotations` let the sync take or prune the object under `AdoptIfNoInventory`:
/// no owning inventory, or this one (G `checkInventoryPolicy`). The refusing owner if not.
fn foreign_owner(annotations: &BTreeMap<String, String>) -> Option<&str> {
    annotations
        .get(OWNING_INVENTORY)
        .map(String::as_str)
        .filter(|owner| *owner != INVENTORY_NAME)
}

/// Where an object lives on the server: its resource, and its id and namespace there.
#[derive(Debug, Clone)]
struct Located {
    /// The API resource of its kind.
    resource: ApiResource,
    /// Whether its kind is namespaced.
    namespaced: bool,
    /// The object, its namespace defaulted (namespaced) or dropped (cluster-scoped).
    id: ObjectId,
}

impl Located {
    /// A dynamic API for the object's kind, in its namespace.
    fn api(&self, client: &kube::Client) -> Api<DynamicObject> {
        if self.namespaced {
            Api::namespaced_with(client.clone(), &self.id.namespace, &self.resource)
        } else {
            Api::all_with(client.clone(), &self.resource)
        }
    }
}

/// Kinds resolved through discovery, each asked once until [`Kinds::forget`].
#[derive(Default)]
struct Kinds {
    /// What discovery said of each GVK: its resource and scope, or not served.
    known: HashMap<GroupVersionKind, Option<(ApiResource, Scope)>>,
}

impl Kinds {
    /// Forgets what discovery said: after CRDs were applied, it is asked again.
    fn forget(&mut self) {
        self.known.clear();
    }

    /// Where `object` lives, or `None` if the server does not serve its kind.
    async fn locate(
        &mut self,
        client: &kube::Client,
        object: &Prepared,
    ) -> Result<Option<Located>, SyncError> {
        let found = match self.known.get(&object.gvk) {
            Some(found) => found.clone(),
            None => {
                let found = match kube::discovery::pinned_kind(client, &object.gvk).await {
                    Ok((resource, caps)) => Some((resource, caps.scope)),
                    Err(kube::Error::Discovery(_)) => None,
                    Err(kube::Error::Api(status)) if status.code == 404 => None,
                    Err(source) => {
                        return Err(SyncError::Read {
                            object: object.id(),
                            source: Box::new(source),
                        });
                    }
                };
                self.known.insert(object.gvk.clone(), found.clone());
                found
            }
        };
        Ok(found.map(|(resource, scope)| {
            let namespaced = scope == Scope::Namespaced;
            let mut id = object.id();
            if !namespaced {
                id.namespace.clear();
            } else if id.namespace.is_empty() {
                id.namespace = "default".into();
            }
            Located {
                resource,
                namespaced,
                id,
            }
        }))
    }

    /// Where `object` lives, waiting up to [`DISCOVERY_TIMEOUT`] for its kind if a CRD of
    /// this sync defines it (discovery may lag behind the CRD's established condition).
    async fn locate_now(
        &mut self,
        client: &kube::Client,
        object: &Prepared,
        defined: bool,
    ) -> Result<Located, SyncError> {
        let deadline = tokio::time::Instant::now() + DISCOVERY_TIMEOUT;
        loop {
            if let Some(located) = self.locate(client, object).await? {
                return Ok(located);
            }
            if !defined || tokio::time::Instant::now() >= deadline {
                return Err(SyncError::UnknownKind {
                    object: object.id(),
                    api_version: object.api_version.clone(),
                });
            }
            self.known.remove(&object.gvk);
            tokio::time::sleep(POLL).await;
        }
    }
}

/// The inventory ConfigMap's entries, as read and as they will be written.
struct Inventory {
    /// The objects it lists.
    entries: BTreeSet<ObjectId>,
}

impl Inventory {
    /// Reads the inventory, creating it empty (and its namespace) if missing (G
    /// `GetInventory`, `configmap.NewInventory`).
    async fn read(client: &kube::Client) -> Result<Inventory, SyncError> {
        let fail = |source| SyncError::Inventory {
            source: Box::new(source),
        };
        let namespaces: Api<Namespace> = Api::all(client.clone());
        if namespaces
            .get_opt(INVENTORY_NAMESPACE)
            .await
            .map_err(fail)?
            .is_none()
        {
            let namespace = Namespace {
                metadata: ObjectMeta {
                    name: Some(INVENTORY_NAMESPACE.into()),
                    ..ObjectMeta::default()
                },
                ..Namespace::default()
            };
            match namespaces.create(&PostParams::default(), &namespace).await {
                Ok(_) => {}
                Err(kube::Error::Api(s)) if s.is_already_exists() => {}
                Err(source) => return Err(fail(source)),
            }
        }
        let config_maps: Api<ConfigMap> = Api::namespaced(client.clone(), INVENTORY_NAMESPACE);
        let config_map = match config_maps.get_opt(INVENTORY_NAME).await.map_err(fail)? {
            Some(config_map) => config_map,
            None => config_maps
                .create(
                    &PostParams::default(),
                    &inventory_config_map(BTreeMap::new()),
                )
                .await
                .map_err(fail)?,
        };
        let entries = config_map
            .data
            .unwrap_or_default()
            .into_keys()
            .map(|key| ObjectId::from_inventory_key(&key).ok_or(SyncError::InventoryEntry { key }))
            .collect::<Result<_, _>>()?;
        Ok(Inventory { entries })
    }

    /// Adds every applied object, and drops the entries Talos 1.13 made of a cluster-scoped
    /// object with the namespace its manifest gave it (T `controllers/k8s/manifest_apply.go`
    /// removes them the same way), so pruning does not take them for objects gone.
    fn record(&mut self, applied: &[Applied]) {
        self.entries.retain(|entry| {
            entry.namespace.is_empty()
                || !applied.iter().any(|a| {
                    a.object.namespace.is_empty()
                        && a.object.group == entry.group
                        && a.object.kind == entry.kind
                        && a.object.name == entry.name
                })
        });
        self.entries
            .extend(applied.iter().map(|a| a.object.clone()));
    }

    /// Writes the entries over the ConfigMap's data, each key with an empty value (G
    /// `configmap.Inventory.Write`).
    async fn write(&self, client: &kube::Client) -> Result<(), SyncError> {
        let data = self
            .entries
            .iter()
            .map(|id| (id.inventory_key(), String::new()))
            .collect();
        Api::<ConfigMap>::namespaced(client.clone(), INVENTORY_NAMESPACE)
            .replace(
                INVENTORY_NAME,
                &PostParams::default(),
                &inventory_config_map(data),
            )
            .await
            .map(drop)
            .map_err(|source| SyncError::Inventory {
                source: Box::new(source),
            })
    }
}

/// The inventory ConfigMap holding `data`.
fn inventory_config_map(data: BTreeMap<String, String>) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(INVENTORY_NAME.into()),
            namespace: Some(INVENTORY_NAMESPACE.into()),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    }
}

/// Every object located (or `None`, a kind not served yet) with the `resourceVersion` it has
/// now (or `None`, absent); an existing object of another inventory is refused here, before
/// anything is written (G `Manager.Apply`, its diff of every object first).
async fn observe(
    client: &kube::Client,
    kinds: &mut Kinds,
    objects: &[Prepared],
) -> Result<Vec<Option<(Located, Option<String>)>>, SyncError> {
    let mut seen = Vec::with_capacity(objects.len());
    for object in objects {
        let Some(located) = kinds.locate(client, object).await? else {
            seen.push(None);
            continue;
        };
        let live = located
            .api(client)
            .get_opt(&located.id.name)
            .await
            .map_err(|source| SyncError::Read {
                object: located.id.clone(),
                source: Box::new(source),
            })?;
        if let Some(live) = &live
            && let Some(owner) = foreign_owner(
                live.metadata
                    .annotations
                    .as_ref()
                    .unwrap_or(&BTreeMap::new()),
            )
        {
            return Err(SyncError::ForeignInventory {
                object: located.id.clone(),
                owner: owner.to_owned(),
            });
        }
        let version = live.and_then(|l| l.metadata.resource_version);
        seen.push(Some((located, version)));
    }
    Ok(seen)
}

/// Applies one located object (server-side, field manager `talos`, forced) and says what
/// changed.
async fn apply_one(
    client: &kube::Client,
    object: &Prepared,
    located: &Located,
    before: Option<&str>,
) -> Result<Change, SyncError> {
    let mut body = object.body.clone();
    let metadata = &mut body["metadata"];
    if located.namespaced {
        metadata["namespace"] = located.id.namespace.clone().into();
    } else if let Some(metadata) = metadata.as_object_mut() {
        metadata.remove("namespace");
    }
    let params = PatchParams::apply(FIELD_MANAGER).force();
    let after = located
        .api(client)
        .patch(&located.id.name, &params, &Patch::Apply(&body))
        .await
        .map_err(|source| SyncError::Apply {
            object: located.id.clone(),
            source: Box::new(source),
        })?;
    Ok(match before {
        None => Change::Created,
        Some(version) if after.metadata.resource_version.as_deref() == Some(version) => {
            Change::Unchanged
        }
        Some(_) => Change::Configured,
    })
}

/// Waits until the CRD `id` is established; a refused name or a failed establishment ends
/// the wait (C kstatus `crdConditions`).
async fn wait_established(client: &kube::Client, id: &ObjectId) -> Result<(), SyncError> {
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let deadline = tokio::time::Instant::now() + ESTABLISH_TIMEOUT;
    loop {
        let crd = crds.get(&id.name).await.map_err(|source| SyncError::Read {
            object: id.clone(),
            source: Box::new(source),
        })?;
        let conditions = crd.status.and_then(|s| s.conditions).unwrap_or_default();
        for c in &conditions {
            let failed = (c.type_ == "NamesAccepted" && c.status == "False")
                || (c.type_ == "Established"
                    && c.status == "False"
                    && c.reason.as_deref() != Some("Installing"));
            if failed {
                return Err(SyncError::NotEstablished {
                    object: id.clone(),
                    detail: format!(
                        "{} is False: {}",
                        c.type_,
                        c.message.as_deref().unwrap_or("")
                    ),
                });
            }
            if c.type_ == "Established" && c.status == "True" {
                return Ok(());
            }
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(SyncError::NotEstablished {
                object: id.clone(),
                detail: format!("not established within {ESTABLISH_TIMEOUT:?}"),
            });
        }
        tokio::time::sleep(POLL).await;
    }
}

/// The group and kind of every custom resource a CRD among `objects` defines.
fn defined_kinds(objects: &[Prepared]) -> HashSet<(String, String)> {
    objects
        .iter()
        .filter(|o| {
            o.gvk.group == "apiextensions.k8s.io" && o.gvk.kind == "CustomResourceDefinition"
        })
        .filter_map(|o| {
            let spec = &o.body["spec"];
            Some((
                spec["group"].as_str()?.to_owned(),
                spec["names"]["kind"].as_str()?.to_owned(),
            ))
        })
        .collect()
}

/// Applies every object stage by stage, recording each in `synced`; after the definitions,
/// waits for the CRDs and forgets what discovery said.
async fn apply_stages(
    client: &kube::Client,
    kinds: &mut Kinds,
    objects: &[Prepared],
    seen: Vec<Option<(Located, Option<String>)>>,
    synced: &mut Synced,
) -> Result<(), SyncError> {
    let defined = defined_kinds(objects);
    for stage in Stage::ALL {
        for (object, seen) in objects.iter().zip(&seen) {
            if object.stage != stage {
                continue;
            }
            let (located, before) = match seen {
                Some((located, before)) => (located.clone(), before.as_deref()),
                None => {
                    let kind = (object.gvk.group.clone(), object.gvk.kind.clone());
                    let located = kinds
                        .locate_now(client, object, defined.contains(&kind))
                        .await?;
                    (located, None)
                }
            };
            let change = apply_one(client, object, &located, before).await?;
            synced.applied.push(Applied {
                stage,
                object: located.id,
                change,
            });
        }
        if stage == Stage::Definitions {
            for crd in synced.in_stage(stage).map(|a| &a.object) {
                if crd.group == "apiextensions.k8s.io" && crd.kind == "CustomResourceDefinition" {
                    wait_established(client, crd).await?;
                }
            }
            kinds.forget();
        }
    }
    Ok(())
}

/// Deletes every object `inventory` lists that `synced` did not apply, unless another
/// inventory owns it (G `Manager.Apply`, its prune); each one gone leaves the inventory.
/// A kind the server no longer serves leaves the inventory too. A failed delete stays listed
/// and is returned once the others were tried.
async fn prune(
    client: &kube::Client,
    inventory: &mut Inventory,
    synced: &mut Synced,
) -> Result<(), SyncError> {
    let stale = stale(&inventory.entries, &synced.applied);
    if stale.is_empty() {
        return Ok(());
    }
    let groups: BTreeSet<&str> = stale.iter().map(|id| id.group.as_str()).collect();
    let groups: Vec<&str> = groups.into_iter().collect();
    let discovery = Discovery::new(client.clone())
        .filter(&groups)
        .run()
        .await
        .map_err(|source| SyncError::Read {
            object: stale[0].clone(),
            source: Box::new(source),
        })?;
    let mut failed = None;
    for id in stale {
        let Some((resource, caps)) = discovery
            .get(&id.group)
            .and_then(|group| group.recommended_kind(&id.kind))
        else {
            inventory.entries.remove(&id);
            continue;
        };
        let namespaced = caps.scope == Scope::Namespaced;
        if namespaced && id.namespace.is_empty() {
            // A namespaced object listed without a namespace names nothing to delete.
            inventory.entries.remove(&id);
            continue;
        }
        let located = Located {
            resource,
            namespaced,
            id,
        };
        match prune_one(client, &located).await {
            Ok(deleted) => {
                inventory.entries.remove(&located.id);
                if deleted {
                    synced.pruned.push(located.id);
                }
            }
            Err(error @ SyncError::ForeignInventory { .. }) => return Err(error),
            Err(error) => {
                failed.get_or_insert(error);
            }
        }
    }
    failed.map_or(Ok(()), Err)
}

/// Deletes one stale object (propagation `Background`): `false` if it was gone already.
async fn prune_one(client: &kube::Client, located: &Located) -> Result<bool, SyncError> {
    let api = located.api(client);
    let fail = |source| SyncError::Prune {
        object: located.id.clone(),
        source: Box::new(source),
    };
    let Some(live) = api.get_opt(&located.id.name).await.map_err(fail)? else {
        return Ok(false);
    };
    if let Some(owner) = foreign_owner(
        live.metadata
            .annotations
            .as_ref()
            .unwrap_or(&BTreeMap::new()),
    ) {
        return Err(SyncError::ForeignInventory {
            object: located.id.clone(),
            owner: owner.to_owned(),
        });
    }
    match api
        .delete(&located.id.name, &DeleteParams::background())
        .await
    {
        Ok(_) => Ok(true),
        Err(kube::Error::Api(s)) if s.is_not_found() => Ok(false),
        Err(source) => Err(fail(source)),
    }
}

/// Syncs the bootstrap manifests into the workload cluster `client` reaches, as `talosctl
/// upgrade-k8s` does for Talos ≥ 1.13: server-side apply in Talos's stages, the inventory
/// updated, objects no longer in the manifests pruned (see the module doc).
pub async fn sync(
    client: &kube::Client,
    manifests: &[ichor_talos::Manifest],
) -> Result<Synced, SyncError> {
    let objects = prepare(manifests)?;
    let mut inventory = Inventory::read(client).await?;
    let mut kinds = Kinds::default();
    let seen = observe(client, &mut kinds, &objects).await?;
    let mut synced = Synced::default();
    let applied = apply_stages(client, &mut kinds, &objects, seen, &mut synced).await;
    inventory.record(&synced.applied);
    let written = inventory.write(client).await;
    applied?;
    written?;
    let pruned = prune(client, &mut inventory, &mut synced).await;
    let written = inventory.write(client).await;
    pruned?;
    written?;
    Ok(synced)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn manifest(id: &str, objects: Vec<Value>) -> ichor_talos::Manifest {
        ichor_talos::Manifest {
            id: id.into(),
            objects,
        }
    }

    fn object(api_version: &str, kind: &str, namespace: Option<&str>, name: &str) -> Value {
        let mut metadata = json!({ "name": name });
        if let Some(namespace) = namespace {
            metadata["namespace"] = namespace.into();
        }
        json!({ "apiVersion": api_version, "kind": kind, "metadata": metadata })
    }

    fn id(group: &str, kind: &str, namespace: &str, name: &str) -> ObjectId {
        ObjectId {
            group: group.into(),
            kind: kind.into(),
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    #[test]
    fn stages_follow_talos_definitions_classes_config_maps_and_secrets_then_the_rest() {
        let cases = [
            (
                "apiextensions.k8s.io/v1",
                "CustomResourceDefinition",
                Stage::Definitions,
            ),
            ("v1", "Namespace", Stage::Definitions),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRole",
                Stage::Definitions,
            ),
            (
                "rbac.authorization.k8s.io/v1",
                "ClusterRoleBinding",
                Stage::Rest,
            ),
            ("storage.k8s.io/v1", "StorageClass", Stage::Classes),
            ("scheduling.k8s.io/v1", "PriorityClass", Stage::Classes),
            ("v1", "ConfigMap", Stage::Data),
            ("v1", "Secret", Stage::Data),
            ("example.com/v1", "ConfigMap", Stage::Rest),
            ("apps/v1", "DaemonSet", Stage::Rest),
            ("v1", "ServiceAccount", Stage::Rest),
        ];
        for (api_version, kind, stage) in cases {
            assert_eq!(Stage::of(api_version, kind), stage, "{api_version} {kind}");
        }
    }

    #[test]
    fn objects_are_applied_by_stage_then_in_fluxcd_kind_order_then_by_name() {
        let objects = prepare(&[
            manifest(
                "10-kube-proxy",
                vec![
                    object("apps/v1", "DaemonSet", Some("kube-system"), "kube-proxy"),
                    object("v1", "ServiceAccount", Some("kube-system"), "kube-proxy"),
                    object(
                        "rbac.authorization.k8s.io/v1",
                        "ClusterRoleBinding",
                        None,
                        "kube-proxy",
                    ),
                    object("v1", "ConfigMap", Some("kube-system"), "kube-proxy-config"),
                ],
            ),
            manifest(
                "11-core-dns",
                vec![
                    object("apps/v1", "Deployment", Some("kube-system"), "coredns"),
                    object(
                        "rbac.authorization.k8s.io/v1",
                        "ClusterRole",
                        None,
                        "system:coredns",
                    ),
                    object("v1", "Service", Some("kube-system"), "kube-dns"),
                    object("v1", "Namespace", None, "extra"),
                ],
            ),
        ])
        .expect("prepared");
        let order: Vec<String> = objects.iter().map(|o| o.id().to_string()).collect();
        assert_eq!(
            order,
            [
                "Namespace/extra",
                "ClusterRole/system:coredns",
                "ConfigMap/kube-system/kube-proxy-config",
                "ClusterRoleBinding/kube-proxy",
                "ServiceAccount/kube-system/kube-proxy",
                "Service/kube-system/kube-dns",
                "Deployment/kube-system/coredns",
                "DaemonSet/kube-system/kube-proxy",
            ]
        );
        assert!(
            objects
                .iter()
                .all(|o| { o.body["metadata"]["annotations"][OWNING_INVENTORY] == INVENTORY_NAME })
        );
    }

    #[test]
    fn an_object_without_kind_api_version_or_name_is_refused_naming_its_manifest() {
        let cases = [
            (
                json!({ "apiVersion": "v1", "metadata": { "name": "a" } }),
                "has no kind",
            ),
            (
                json!({ "kind": "Service", "metadata": { "name": "a" } }),
                "has no apiVersion",
            ),
            (
                json!({ "apiVersion": "v1", "kind": "Service" }),
                "Service has no metadata.name",
            ),
            (
                json!({ "apiVersion": "v1", "kind": "Service", "metadata": { "name": "" } }),
                "Service has no metadata.name",
            ),
            (
                json!({ "apiVersion": 1, "kind": "Service" }),
                "has apiVersion 1, not a string",
            ),
            (
                json!({ "apiVersion": "v1", "kind": "Service", "metadata": [] }),
                "has a metadata that is not an object",
            ),
            (json!("text"), "is not a JSON object"),
        ];
        for (bad, problem) in cases {
            let error = prepare(&[manifest(
                "99-extra",
                vec![
                    object("v1", "ConfigMap", Some("default"), "fine"),
                    bad.clone(),
                ],
            )])
            .expect_err("refused");
            assert_eq!(
                error.to_string(),
                format!("manifest 99-extra: object 1 {problem}"),
                "{bad}"
            );
        }
    }

    #[test]
    fn an_object_its_manifest_gives_to_another_inventory_is_refused() {
        let mut foreign = object("v1", "ConfigMap", Some("default"), "x");
        foreign["metadata"]["annotations"] = json!({ OWNING_INVENTORY: "other" });
        let error = prepare(&[manifest("99-x", vec![foreign])]).expect_err("refused");
        assert_eq!(
            error.to_string(),
            "ConfigMap/default/x belongs to inventory \"other\", not talos-bootstrap-manifests-inventory"
        );
        let mut ours = object("v1", "ConfigMap", Some("default"), "x");
        ours["metadata"]["annotations"] = json!({ OWNING_INVENTORY: INVENTORY_NAME, "a": "b" });
        let prepared = prepare(&[manifest("99-x", vec![ours])]).expect("ours");
        assert_eq!(prepared[0].body["metadata"]["annotations"]["a"], "b");
    }

    #[test]
    fn inventory_keys_are_cli_utils_object_metadata_strings() {
        let binding = id(
            "rbac.authorization.k8s.io",
            "ClusterRoleBinding",
            "",
            "system:coredns",
        );
        assert_eq!(
            binding.inventory_key(),
            "_system__coredns_rbac.authorization.k8s.io_ClusterRoleBinding"
        );
        let daemon_set = id("apps", "DaemonSet", "kube-system", "kube-proxy");
        assert_eq!(
            daemon_set.inventory_key(),
            "kube-system_kube-proxy_apps_DaemonSet"
        );
        let service = id("", "Service", "kube-system", "kube-dns");
        assert_eq!(service.inventory_key(), "kube-system_kube-dns__Service");
        for object in [binding, daemon_set, service] {
            assert_eq!(
                ObjectId::from_inventory_key(&object.inventory_key()),
                Some(object)
            );
        }
        assert_eq!(ObjectId::from_inventory_key("no-separators"), None);
        assert_eq!(ObjectId::from_inventory_key("a_b"), None);
    }

    #[test]
    fn pruning_takes_the_inventory_entries_no_applied_object_is() {
        let applied = |object| Applied {
            stage: Stage::Rest,
            object,
            change: Change::Unchanged,
        };
        let inventory: BTreeSet<ObjectId> = [
            id("apps", "DaemonSet", "kube-system", "kube-proxy"),
            id("", "Service", "kube-system", "kube-dns"),
            id(
                "rbac.authorization.k8s.io",
                "ClusterRoleBinding",
                "",
                "kube-proxy",
            ),
            id("apps", "Deployment", "other", "coredns"),
        ]
        .into();
        let stale = stale(
            &inventory,
            &[
                applied(id("apps", "DaemonSet", "kube-system", "kube-proxy")),
                applied(id(
                    "rbac.authorization.k8s.io",
                    "ClusterRoleBinding",
                    "",
                    "kube-proxy",
                )),
                applied(id("apps", "Deployment", "kube-system", "coredns")),
            ],
        );
        assert_eq!(
            stale,
            [
                id("", "Service", "kube-system", "kube-dns"),
                id("apps", "Deployment", "other", "coredns"),
            ]
        );
    }

    #[test]
    fn only_another_inventorys_annotation_refuses_an_object() {
        let annotations =
            |owner: &str| BTreeMap::from([(OWNING_INVENTORY.to_owned(), owner.to_owned())]);
        assert_eq!(foreign_owner(&BTreeMap::new()), None);
        assert_eq!(foreign_owner(&annotations(INVENTORY_NAME)), None);
        assert_eq!(foreign_owner(&annotations("other")), Some("other"));
    }

    #[test]
    fn a_cluster_scoped_object_listed_with_a_namespace_is_listed_without_one() {
        let mut inventory = Inventory {
            entries: [
                id(
                    "rbac.authorization.k8s.io",
                    "ClusterRole",
                    "kube-system",
                    "talos",
                ),
                id("", "ConfigMap", "kube-system", "talos"),
                id("apps", "DaemonSet", "kube-system", "gone"),
            ]
            .into(),
        };
        let applied = |object| Applied {
            stage: Stage::Rest,
            object,
            change: Change::Unchanged,
        };
        inventory.record(&[
            applied(id("rbac.authorization.k8s.io", "ClusterRole", "", "talos")),
            applied(id("", "ConfigMap", "kube-system", "talos")),
        ]);
        assert_eq!(
            inventory.entries.into_iter().collect::<Vec<_>>(),
            [
                id("", "ConfigMap", "kube-system", "talos"),
                id("apps", "DaemonSet", "kube-system", "gone"),
                id("rbac.authorization.k8s.io", "ClusterRole", "", "talos"),
            ]
        );
    }
}
