//! Chainable builders for tests (feature `testing`, off by default): small valid objects of
//! each kind, changed one aspect at a time.
//!
//! ```
//! # use ichor_api::{TalosCluster, TalosMachine};
//! let cluster = TalosCluster::test("demo").control_planes(3).build();
//! let machine = TalosMachine::test("cp-1").control_plane().approved().at("10.5.0.2").build();
//! assert_eq!(cluster.spec.control_plane.count, 3);
//! assert_eq!(machine.spec.endpoints, ["10.5.0.2"]);
//! ```
//!
//! A builder makes the typed object (`build`) or its JSON (`json`) for tests that send raw
//! objects. Input the types cannot express (what CEL or the schema must refuse) stays JSON in
//! the tests that send it.

use std::collections::BTreeMap;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{LabelSelector, ObjectMeta};
use serde_json::Value;

use crate::cluster::{CniPreset, DiscoverySpec, KubeProxyMode};
use crate::common::{InstallSpec, LocalObjectReference, Role};
use crate::config::ConfigPatch;
use crate::machine::{ApprovalState, TalosMachineStatus};
use crate::names::{annotations, finalizers};
use crate::operation::{OperationAction, UpgradeKubernetesSpec, UpgradeSpec};
use crate::{
    TalosCluster, TalosClusterSpec, TalosMachine, TalosMachineSpec, TalosOperation,
    TalosOperationSpec,
};

/// The cluster a test object belongs to unless told otherwise.
pub const CLUSTER: &str = "lab";

/// A well-formed certificate fingerprint (base64 of 32 bytes), pinned by test machines.
pub const FINGERPRINT: &str = "n7cGkBrmW4Sdq4aR8RCH7TL+5L3N8CuTDxQYX0ngk4U=";

/// The address test machines answer at unless told otherwise.
pub const ADDRESS: &str = "192.168.10.21";

fn metadata(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        ..ObjectMeta::default()
    }
}

fn insert(map: &mut Option<BTreeMap<String, String>>, key: &str, value: &str) {
    map.get_or_insert_with(BTreeMap::new)
        .insert(key.to_owned(), value.to_owned());
}

fn to_json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("an API object serializes")
}

/// The metadata setters every builder shares.
macro_rules! metadata_setters {
    () => {
        /// Puts the object in `namespace`.
        pub fn namespace(mut self, namespace: &str) -> Self {
            self.0.metadata.namespace = Some(namespace.to_owned());
            self
        }

        /// Adds the label `key: value`.
        pub fn label(mut self, key: &str, value: &str) -> Self {
            insert(&mut self.0.metadata.labels, key, value);
            self
        }

        /// Adds the annotation `key: value`.
        pub fn annotation(mut self, key: &str, value: &str) -> Self {
            insert(&mut self.0.metadata.annotations, key, value);
            self
        }

        /// Adds the `allow-delete` annotation.
        pub fn allow_delete(self) -> Self {
            self.annotation(annotations::ALLOW_DELETE, "true")
        }

        /// Adds the finalizer `name`.
        pub fn finalizer(mut self, name: &str) -> Self {
            self.0
                .metadata
                .finalizers
                .get_or_insert_with(Vec::new)
                .push(name.to_owned());
            self
        }

        /// The JSON of the object, for tests that send raw objects.
        pub fn json(&self) -> Value {
            to_json(&self.0)
        }
    };
}

/// The install-disk and config-patch setters the cluster and machine builders share: the
/// cluster's are defaults for every machine, the machine's its own.
macro_rules! config_setters {
    ($disk_doc:literal, $patch_doc:literal) => {
        #[doc = $disk_doc]
        pub fn install_disk(mut self, disk: &str) -> Self {
            self.0
                .spec
                .install
                .get_or_insert_with(InstallSpec::default)
                .disk = Some(disk.to_owned());
            self
        }

        #[doc = $patch_doc]
        pub fn patch(mut self, patch: ConfigPatch) -> Self {
            self.0.spec.config_patches.push(patch);
            self
        }
    };
}

impl TalosCluster {
    /// A valid cluster named `name` for tests: Talos v1.14.1, Kubernetes 1.36.3, one control
    /// plane behind `https://192.168.10.5:6443`, flannel with kube-proxy, no discovery.
    pub fn test(name: &str) -> ClusterBuilder {
        ClusterBuilder(TalosCluster {
            metadata: metadata(name),
            spec: TalosClusterSpec::new("v1.14.1", "1.36.3", "https://192.168.10.5:6443", 1),
            status: None,
        })
    }
}

/// Builds a [`TalosCluster`] for a test; see [`TalosCluster::test`].
#[derive(Debug, Clone)]
#[must_use]
pub struct ClusterBuilder(TalosCluster);

impl ClusterBuilder {
    metadata_setters!();

    /// The finished cluster.
    pub fn build(self) -> TalosCluster {
        self.0
    }

    /// The finished spec alone.
    pub fn spec(self) -> TalosClusterSpec {
        self.0.spec
    }

    /// Declares `count` control planes.
    pub fn control_planes(mut self, count: i32) -> Self {
        self.0.spec.control_plane.count = count;
        self
    }

    /// Renders for (and installs) Talos `version`.
    pub fn talos(mut self, version: &str) -> Self {
        self.0.spec.talos_version = version.to_owned();
        self
    }

    /// Runs Kubernetes `version`.
    pub fn kubernetes(mut self, version: &str) -> Self {
        self.0.spec.kubernetes_version = version.to_owned();
        self
    }

    /// Joins nodes through `endpoint` (an https URL).
    pub fn endpoint(mut self, endpoint: &str) -> Self {
        self.0.spec.endpoint = endpoint.to_owned();
        self
    }

    /// Deploys the CNI `preset`, with kube-proxy only for flannel (which needs it).
    pub fn cni(mut self, preset: CniPreset) -> Self {
        self.0.spec.cni.preset = preset;
        self.0.spec.kube_proxy = if preset == CniPreset::Flannel {
            KubeProxyMode::Enabled
        } else {
            KubeProxyMode::Disabled
        };
        self
    }

    /// Runs kube-proxy or not.
    pub fn kube_proxy(mut self, mode: KubeProxyMode) -> Self {
        self.0.spec.kube_proxy = mode;
        self
    }

    /// Sweeps `cidrs` every `interval` (e.g. `10s`).
    pub fn discovery<S: AsRef<str>>(mut self, cidrs: &[S], interval: &str) -> Self {
        self.0.spec.discovery = Some(DiscoverySpec {
            cidrs: cidrs.iter().map(|c| c.as_ref().to_owned()).collect(),
            interval: interval.to_owned(),
        });
        self
    }

    config_setters!(
        "Installs to `disk` (e.g. `/dev/vda`) by default.",
        "Adds a config patch for every machine."
    );

    /// Installs the installer `image` by default.
    pub fn installer(mut self, image: &str) -> Self {
        self.0
            .spec
            .install
            .get_or_insert_with(InstallSpec::default)
            .image = Some(image.to_owned());
        self
    }

    /// Reads the secrets bundle from the Secret `name`.
    pub fn secrets(mut self, name: &str) -> Self {
        self.0.spec.secrets_ref = Some(LocalObjectReference {
            name: name.to_owned(),
        });
        self
    }

    /// Sets the pod and service subnets.
    pub fn subnets(mut self, pods: &[&str], services: &[&str]) -> Self {
        self.0.spec.network.pod_subnets = pods.iter().map(|s| (*s).to_owned()).collect();
        self.0.spec.network.service_subnets = services.iter().map(|s| (*s).to_owned()).collect();
        self
    }
}

impl From<ClusterBuilder> for TalosCluster {
    fn from(builder: ClusterBuilder) -> Self {
        builder.build()
    }
}

impl TalosMachine {
    /// A pending machine named `name` for tests: cluster `lab`, answering at
    /// [`ADDRESS`], pinned to [`FINGERPRINT`], no role.
    pub fn test(name: &str) -> MachineBuilder {
        MachineBuilder(TalosMachine {
            metadata: metadata(name),
            spec: TalosMachineSpec::pending(CLUSTER, ADDRESS, FINGERPRINT),
            status: None,
        })
    }
}

/// Builds a [`TalosMachine`] for a test; see [`TalosMachine::test`].
#[derive(Debug, Clone)]
#[must_use]
pub struct MachineBuilder(TalosMachine);

impl MachineBuilder {
    metadata_setters!();

    /// The finished machine.
    pub fn build(self) -> TalosMachine {
        self.0
    }

    /// Belongs to the TalosCluster `name`.
    pub fn cluster(mut self, name: &str) -> Self {
        self.0.spec.cluster_ref.name = name.to_owned();
        self
    }

    /// Has the role `role`.
    pub fn role(mut self, role: Role) -> Self {
        self.0.spec.role = Some(role);
        self
    }

    /// Is a control plane.
    pub fn control_plane(self) -> Self {
        self.role(Role::ControlPlane)
    }

    /// Is a worker.
    pub fn worker(self) -> Self {
        self.role(Role::Worker)
    }

    /// Is in approval state `state`.
    pub fn approval(mut self, state: ApprovalState) -> Self {
        self.0.spec.approval_state = state;
        self
    }

    /// Is approved (Ichor may configure it).
    pub fn approved(self) -> Self {
        self.approval(ApprovalState::Approved)
    }

    /// Is rejected (never touched).
    pub fn rejected(self) -> Self {
        self.approval(ApprovalState::Rejected)
    }

    /// Answers at `address` only.
    pub fn at(mut self, address: &str) -> Self {
        self.0.spec.endpoints = vec![address.to_owned()];
        self
    }

    /// Is pinned to `fingerprint`.
    pub fn fingerprint(mut self, fingerprint: &str) -> Self {
        self.0.spec.fingerprint = Some(fingerprint.to_owned());
        self
    }

    /// Is to be named `hostname`.
    pub fn hostname(mut self, hostname: &str) -> Self {
        self.0.spec.hostname = Some(hostname.to_owned());
        self
    }

    config_setters!(
        "Installs to `disk`.",
        "Adds a config patch for this machine."
    );

    /// Holds the removal finalizer, as every approved machine does once the manager saw it.
    pub fn removal_finalizer(self) -> Self {
        self.finalizer(finalizers::MACHINE_REMOVAL)
    }

    /// Has the observed state `status` (for pure tests; the apiserver takes status only
    /// through the status subresource).
    pub fn status(mut self, status: TalosMachineStatus) -> Self {
        self.0.status = Some(status);
        self
    }

    /// Records an applied config (`status.appliedConfigHash`): a machine that was configured.
    pub fn applied(mut self, hash: &str) -> Self {
        let status = self
            .0
            .status
            .get_or_insert_with(TalosMachineStatus::default);
        status.applied.config_hash = Some(hash.to_owned());
        self
    }
}

impl From<MachineBuilder> for TalosMachine {
    fn from(builder: MachineBuilder) -> Self {
        builder.build()
    }
}

impl TalosOperation {
    /// An operation named `name` doing `action` on cluster `lab`, with no target yet (choose
    /// one with [`OperationBuilder::machine`] or [`OperationBuilder::all`]).
    pub fn test(name: &str, action: OperationAction) -> OperationBuilder {
        OperationBuilder(TalosOperation {
            metadata: metadata(name),
            spec: TalosOperationSpec::new(CLUSTER, action),
            status: None,
        })
    }
}

/// Builds a [`TalosOperation`] for a test; see [`TalosOperation::test`].
#[derive(Debug, Clone)]
#[must_use]
pub struct OperationBuilder(TalosOperation);

impl OperationBuilder {
    metadata_setters!();

    /// The finished operation.
    pub fn build(self) -> TalosOperation {
        self.0
    }

    /// Acts on the machines of the TalosCluster `name`.
    pub fn cluster(mut self, name: &str) -> Self {
        self.0.spec.cluster_ref.name = name.to_owned();
        self
    }

    /// Acts on the one machine `name`.
    pub fn machine(mut self, name: &str) -> Self {
        self.0.spec.machine_name = Some(name.to_owned());
        self
    }

    /// Acts on the machines `selector` selects.
    pub fn selector(mut self, selector: LabelSelector) -> Self {
        self.0.spec.selector = Some(selector);
        self
    }

    /// Acts on every machine of the cluster (an empty selector).
    pub fn all(self) -> Self {
        self.selector(LabelSelector::default())
    }

    /// Upgrades to the installer `image` (for action `upgrade`).
    pub fn image(mut self, image: &str) -> Self {
        self.0.spec.upgrade = Some(UpgradeSpec {
            image: image.to_owned(),
        });
        self
    }

    /// Upgrades Kubernetes to `version` (for action `upgradeKubernetes`).
    pub fn kubernetes(mut self, version: &str) -> Self {
        self.0.spec.upgrade_kubernetes = Some(UpgradeKubernetesSpec {
            version: version.to_owned(),
        });
        self
    }
}

impl From<OperationBuilder> for TalosOperation {
    fn from(builder: OperationBuilder) -> Self {
        builder.build()
    }
}

/// An `admission.k8s.io/v1` AdmissionReview of `operation` on the TalosMachine `name` in
/// `namespace`, as the apiserver sends one, with `old` as `oldObject` (deletes and updates
/// carry one): what the webhook's tests and the end-to-end specs post to it.
pub fn machine_review(
    uid: &str,
    operation: &str,
    name: &str,
    namespace: &str,
    old: Option<Value>,
) -> Value {
    let mut request = serde_json::json!({
        "uid": uid,
        "kind": {"group": crate::GROUP, "version": crate::VERSION, "kind": "TalosMachine"},
        "resource": {"group": crate::GROUP, "version": crate::VERSION, "resource": "talosmachines"},
        "name": name,
        "namespace": namespace,
        "operation": operation,
        "userInfo": {"username": "someone"},
        "dryRun": false
    });
    if let Some(old) = old {
        request["oldObject"] = old;
    }
    serde_json::json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": request,
    })
}
