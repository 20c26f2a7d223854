//! The `cluster` target at run time: real Talos VMs (KubeVirt) on an outer cluster, brought up
//! and torn down through the rails of [`crate::rails`].
//!
//! The workstation cannot reach pod IPs, so every Talos call runs `talosctl` in a one-shot pod
//! in `ichor-e2e` (its node named explicitly, never a protected address), and the inner
//! apiservers are reached through relay pods and a local port-forward. The first `management`
//! VMs become the inner management cluster — control-plane shaped, configured by this harness
//! from Ichor's own renderer — and the rest stay in maintenance mode for the specs: Ichor,
//! running as a pod on the outer cluster's pod network, discovers and configures them.
//!
//! Every object has a fixed name derived from the plan (see [`object_names`]): one run at a
//! time per outer cluster. `down` deletes exactly those names, after the same checks as `up`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ichor_api::admission;
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
use k8s_openapi::api::core::v1::{Namespace, Pod, Secret, ServiceAccount};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{
    Api, ApiResource, AttachParams, GroupVersionKind, LogParams, ObjectMeta, Patch, PatchParams,
    PostParams,
};
use kube::config::Kubeconfig;
use serde_json::{Value, json};
use tokio::io::AsyncWriteExt as _;
use tokio::sync::Mutex;

use crate::cluster::{CONTROLLER_POD, ClusterPlan, PART_OF, WEBHOOK_PORT};
use crate::rails::{E2E_NAMESPACE, Outer, Pinned, Protected, RailError};
use crate::{Capabilities, Error, Target};

/// The Secret holding the management cluster's talosconfig and configs.
pub const TALOS_SECRET: &str = "ichor-e2e-talos";
/// The one-shot `talosctl` pod (one at a time).
pub const TALOSCTL_POD: &str = "ichor-talosctl";
/// The controller namespace on the inner cluster (leader election, webhook certificate).
pub const INNER_SYSTEM_NAMESPACE: &str = "ichor-system";
/// The Kubernetes API port.
const APISERVER_PORT: u16 = 6443;
/// The field manager of everything this harness applies.
const FIELD_MANAGER: &str = "ichor-e2e";

/// How a `cluster` run is set up.
#[derive(Debug, Clone)]
pub struct ClusterOptions {
    /// VMs, versions, subnets.
    pub plan: ClusterPlan,
    /// How many VMs (the first ones) form the management cluster: 1 or 3 control planes.
    pub management: usize,
    /// The Kubernetes version of every cluster.
    pub kubernetes_version: String,
    /// A minimal image with `sh` and `cat` for the controller pod.
    pub pod_image: String,
    /// The `talosctl` image for one-shot pods.
    pub talosctl_image: String,
    /// An image with `socat` for the relays.
    pub relay_image: String,
    /// The folder holding the statically linked `ichor-manager` and `ichor-webhook`.
    pub binaries: PathBuf,
    /// Addresses never targeted (extended with the outer cluster's node addresses).
    pub protected: Protected,
}

impl ClusterOptions {
    /// Defaults for `talos_version`, with the given schematics and binaries.
    pub fn new(plan: ClusterPlan, binaries: PathBuf) -> Self {
        let talosctl_image = format!("ghcr.io/siderolabs/talosctl:{}", plan.talos_version);
        Self {
            plan,
            management: 1,
            kubernetes_version: "1.36.3".into(),
            pod_image: "busybox:1.37".into(),
            talosctl_image,
            relay_image: "alpine/socat:1.8.0.3".into(),
            binaries,
            protected: Protected::default(),
        }
    }
}

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// KubeVirt's VirtualMachine.
pub fn virtual_machines() -> ApiResource {
    resource("kubevirt.io", "v1", "VirtualMachine", "virtualmachines")
}

/// KubeVirt's VirtualMachineInstance (read only: its addresses).
pub fn virtual_machine_instances() -> ApiResource {
    resource(
        "kubevirt.io",
        "v1",
        "VirtualMachineInstance",
        "virtualmachineinstances",
    )
}

/// CDI's DataVolume.
pub fn data_volumes() -> ApiResource {
    resource("cdi.kubevirt.io", "v1beta1", "DataVolume", "datavolumes")
}

fn pods_resource() -> ApiResource {
    ApiResource::erase::<Pod>(&())
}

fn secrets_resource() -> ApiResource {
    ApiResource::erase::<Secret>(&())
}

/// The relay pod in front of node `i`'s apiserver.
pub fn relay_name(i: usize) -> String {
    format!("ichor-relay-{}", i + 1)
}

/// Every object a run of `plan` may create on the outer cluster, by kind and fixed name: what
/// `down` deletes, and nothing else.
pub fn object_names(plan: &ClusterPlan) -> Vec<(ApiResource, String)> {
    let mut names = vec![
        (pods_resource(), CONTROLLER_POD.to_owned()),
        (pods_resource(), TALOSCTL_POD.to_owned()),
        (secrets_resource(), TALOS_SECRET.to_owned()),
    ];
    for i in 0..plan.nodes {
        let node = ClusterPlan::node_name(i);
        names.push((pods_resource(), relay_name(i)));
        names.push((virtual_machines(), node.clone()));
        names.push((data_volumes(), format!("{node}-iso")));
        names.push((data_volumes(), format!("{node}-disk")));
    }
    names
}

/// The one-shot pod running `talosctl` against exactly `node` (also its endpoint: no
/// forwarding), with the management talosconfig unless `insecure` (maintenance mode).
pub fn talosctl_pod(image: &str, node: std::net::IpAddr, args: &[&str], insecure: bool) -> Value {
    let mut full: Vec<String> = Vec::new();
    if !insecure {
        full.extend(["--talosconfig".into(), "/talos/talosconfig".into()]);
    }
    full.extend([
        "--nodes".into(),
        node.to_string(),
        "--endpoints".into(),
        node.to_string(),
    ]);
    full.extend(args.iter().map(|a| (*a).to_owned()));
    if insecure {
        full.push("--insecure".into());
    }
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": TALOSCTL_POD, "namespace": E2E_NAMESPACE, "labels": {PART_OF.0: PART_OF.1}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "talosctl",
                "image": image,
                "args": full,
                "volumeMounts": [{"name": "talos", "mountPath": "/talos", "readOnly": true}],
            }],
            "volumes": [{"name": "talos", "secret": {"secretName": TALOS_SECRET, "optional": true}}],
        },
    })
}

/// The relay pod forwarding its port 6443 to `address`'s apiserver.
pub fn relay_pod(image: &str, i: usize, address: std::net::IpAddr) -> Value {
    json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": relay_name(i), "namespace": E2E_NAMESPACE, "labels": {PART_OF.0: PART_OF.1}},
        "spec": {
            "restartPolicy": "Never",
            "containers": [{
                "name": "relay",
                "image": image,
                "args": [
                    format!("TCP-LISTEN:{APISERVER_PORT},fork,reuseaddr"),
                    format!("TCP:{address}:{APISERVER_PORT}"),
                ],
                "ports": [{"containerPort": APISERVER_PORT}],
            }],
        },
    })
}

/// The controller pod's start script: the webhook (its IP-SAN leaf for the pod IP) and the
/// manager, both against the inner apiserver at its real address, with an explicit
/// leader-election namespace.
pub fn start_script() -> String {
    format!(
        "#!/bin/sh\n\
         KUBECONFIG=/ichor/webhook.kubeconfig /ichor/ichor-webhook --namespace {INNER_SYSTEM_NAMESPACE} --pod-ip \"$POD_IP\" --port {WEBHOOK_PORT} &\n\
         exec env KUBECONFIG=/ichor/manager.kubeconfig /ichor/ichor-manager --namespace {INNER_SYSTEM_NAMESPACE} --identity ichor-e2e --metrics-addr 0.0.0.0:8080\n"
    )
}

/// A kubeconfig for `server` with the cluster's CA and either a token or a client certificate
/// from `base` (whose user is kept), optionally with a TLS server name.
pub fn rewrite_kubeconfig(
    base: &str,
    server: &str,
    tls_server_name: Option<&str>,
    token: Option<&str>,
) -> Result<String, Error> {
    let mut config =
        Kubeconfig::from_yaml(base).map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
    for named in &mut config.clusters {
        if let Some(cluster) = named.cluster.as_mut() {
            cluster.server = Some(server.to_owned());
            cluster.tls_server_name = tls_server_name.map(str::to_owned);
        }
    }
    if let Some(token) = token {
        for named in &mut config.auth_infos {
            named.auth_info = Some(kube::config::AuthInfo {
                token: Some(token.to_owned().into()),
                ..Default::default()
            });
        }
    }
    serde_saphyr::to_string(&config).map_err(|e| Error::Spec(format!("kubeconfig: {e}")))
}

fn rail(error: RailError) -> Error {
    Error::Spec(error.to_string())
}

fn parse<T: k8s_openapi::serde::de::DeserializeOwned>(value: Value) -> Result<T, Error> {
    serde_json::from_value(value).map_err(|e| Error::Spec(format!("manifest: {e}")))
}

/// Checks the outer cluster before anything is created: the namespace exists, KubeVirt and CDI
/// are served, a node offers `/dev/kvm`, the binaries are there, and the plan holds with the
/// outer subnets. Returns the protected addresses (given plus the outer nodes' own).
pub async fn preflight(
    outer: &Outer,
    pinned: &Pinned,
    options: &mut ClusterOptions,
) -> Result<Protected, Error> {
    let context = &pinned.context;
    if !outer.namespace_exists().await? {
        return Err(Error::Spec(format!(
            "the namespace {E2E_NAMESPACE} does not exist on context {context}: create it (kubectl --context {context} create namespace {E2E_NAMESPACE}); the harness never creates or deletes namespaces there"
        )));
    }
    for (api, what) in [
        ("kubevirt.io/v1", "KubeVirt (VirtualMachine)"),
        ("cdi.kubevirt.io/v1beta1", "CDI (DataVolume)"),
    ] {
        if !outer.serves(api).await? {
            return Err(Error::Spec(format!(
                "the outer cluster (context {context}) does not serve {api}: the cluster target needs {what} installed; nothing was created"
            )));
        }
    }
    let nodes = outer.nodes().await?;
    let kvm = nodes.iter().any(|n| {
        n.status
            .as_ref()
            .and_then(|s| s.allocatable.as_ref())
            .and_then(|a| a.get("devices.kubevirt.io/kvm"))
            .is_some_and(|q| q.0 != "0")
    });
    if !kvm {
        return Err(Error::Spec(format!(
            "no node of the outer cluster (context {context}) offers devices.kubevirt.io/kvm: the VMs need /dev/kvm; nothing was created"
        )));
    }
    for node in &nodes {
        if let Some(cidrs) = node.spec.as_ref().and_then(|s| s.pod_cidrs.as_ref()) {
            options
                .plan
                .outer_subnets
                .extend(cidrs.iter().filter(|c| !c.contains(':')).cloned());
        }
    }
    options
        .plan
        .check()
        .map_err(|e| Error::Spec(e.to_string()))?;
    if !(options.management == 1 || options.management == 3) {
        return Err(Error::Spec(format!(
            "the management cluster has 1 or 3 control planes, not {}",
            options.management
        )));
    }
    if options.plan.nodes <= options.management {
        return Err(Error::Spec(format!(
            "{} nodes leave none for the specs after {} management nodes",
            options.plan.nodes, options.management
        )));
    }
    for name in ["ichor-manager", "ichor-webhook"] {
        if !options.binaries.join(name).is_file() {
            return Err(Error::Binary(format!(
                "{} is missing: build the statically linked binaries first (cargo xtask e2e does)",
                options.binaries.join(name).display()
            )));
        }
    }
    outer_protected(outer, &options.protected).await
}

/// `given` plus the outer cluster's own node addresses: never Talos targets.
pub async fn outer_protected(outer: &Outer, given: &Protected) -> Result<Protected, Error> {
    let mut addresses: Vec<String> = Vec::new();
    for node in outer.nodes().await? {
        if let Some(found) = node.status.as_ref().and_then(|s| s.addresses.as_ref()) {
            addresses.extend(
                found
                    .iter()
                    .filter(|a| a.type_ == "InternalIP" || a.type_ == "ExternalIP")
                    .map(|a| a.address.clone()),
            );
        }
    }
    let outer_nodes = Protected::parse(&addresses.join(",")).map_err(rail)?;
    Ok(given.union(&outer_nodes))
}

/// Runs `talosctl` in one-shot pods in `ichor-e2e`, one at a time, each naming its node.
pub struct TalosPods {
    outer: Outer,
    protected: Protected,
    image: String,
    one_at_a_time: Mutex<()>,
}

impl TalosPods {
    /// Pods of `image` on `outer`, never targeting `protected`.
    pub fn new(outer: Outer, protected: Protected, image: &str) -> Self {
        Self {
            outer,
            protected,
            image: image.to_owned(),
            one_at_a_time: Mutex::default(),
        }
    }

    /// One `talosctl` run: refused before any call when `node` is missing or protected.
    pub async fn run(
        &self,
        node: Option<&str>,
        args: &[&str],
        insecure: bool,
    ) -> Result<String, Error> {
        let address = self.protected.talos_target(node).map_err(rail)?;
        let _one = self.one_at_a_time.lock().await;
        let pods: Api<Pod> = self.outer.api();
        self.outer
            .delete::<Pod>(E2E_NAMESPACE, TALOSCTL_POD)
            .await?;
        eventually(
            "the previous talosctl pod to go",
            Duration::from_secs(120),
            || async { Ok(pods.get_opt(TALOSCTL_POD).await?.is_none().then_some(())) },
        )
        .await?;
        let manifest = talosctl_pod(&self.image, address, args, insecure);
        pods.create(&PostParams::default(), &parse(manifest)?)
            .await?;
        let phase = eventually(
            "the talosctl pod to finish",
            Duration::from_secs(300),
            || async {
                let pod = pods.get(TALOSCTL_POD).await?;
                let phase = pod.status.and_then(|s| s.phase).unwrap_or_default();
                Ok((phase == "Succeeded" || phase == "Failed").then_some(phase))
            },
        )
        .await?;
        let logs = pods
            .logs(TALOSCTL_POD, &LogParams::default())
            .await
            .unwrap_or_default();
        if phase == "Succeeded" {
            Ok(logs)
        } else {
            Err(Error::Spec(format!(
                "talosctl {} on {address} failed: {}",
                args.join(" "),
                logs.trim()
            )))
        }
    }
}

/// Deletes every object of `plan` on the outer cluster, by name, in `ichor-e2e` (the checks
/// of `up` first: the same pinned context).
pub async fn down(pinned: &Pinned, plan: &ClusterPlan) -> Result<(), Error> {
    let outer = Outer::connect(pinned).await?;
    if !outer.namespace_exists().await? {
        return Ok(());
    }
    let kubevirt = outer.serves("kubevirt.io/v1").await?;
    let cdi = outer.serves("cdi.kubevirt.io/v1beta1").await?;
    let mut failures = Vec::new();
    for (kind, name) in object_names(plan) {
        let served = match kind.group.as_str() {
            "kubevirt.io" => kubevirt,
            "cdi.kubevirt.io" => cdi,
            _ => true,
        };
        if !served {
            continue;
        }
        if let Err(e) = outer.delete_dynamic(&kind, E2E_NAMESPACE, &name).await {
            failures.push(format!("{} {name}: {e}", kind.kind));
        }
    }
    if failures.is_empty() {
        Ok(())
    } else {
        Err(Error::Spec(format!(
            "cleanup left objects behind: {}",
            failures.join("; ")
        )))
    }
}

/// A local listener forwarding to a relay pod's port 6443.
struct Relay {
    port: u16,
    task: tokio::task::JoinHandle<()>,
}

/// The `cluster` target, up.
pub struct ClusterTarget {
    outer: Outer,
    options: ClusterOptions,
    protected: Protected,
    addresses: Vec<std::net::IpAddr>,
    bundle: ichor_render::SecretsBundle,
    inner_kubeconfig: String,
    inner: kube::Client,
    relays: Mutex<BTreeMap<usize, Relay>>,
    talos_pods: TalosPods,
}

impl std::fmt::Debug for ClusterTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterTarget")
            .field("addresses", &self.addresses)
            .finish_non_exhaustive()
    }
}

/// Waits with [`ichor_testenv::wait::try_eventually`] for `f` to give a value (`Ok(None)`: not
/// yet; an error is kept as the last observation).
pub(crate) async fn eventually<T, F, Fut>(
    what: &str,
    within: Duration,
    mut f: F,
) -> Result<T, Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, Error>>,
{
    let value = ichor_testenv::wait::try_eventually(what, within, || {
        let attempt = f();
        async move {
            match attempt.await {
                Ok(Some(value)) => Ok(value),
                Ok(None) => Err("not yet".to_owned()),
                Err(e) => Err(e.to_string()),
            }
        }
    })
    .await?;
    Ok(value)
}

impl ClusterTarget {
    /// Brings the target up (see the module docs). On failure the caller runs [`down`].
    pub async fn up(pinned: &Pinned, mut options: ClusterOptions) -> Result<Self, Error> {
        let outer = Outer::connect(pinned).await?;
        let protected = preflight(&outer, pinned, &mut options).await?;
        let plan = options.plan.clone();

        // The VMs: each with its own ISO and a blank disk.
        for i in 0..plan.nodes {
            for volume in plan.data_volumes(i) {
                outer
                    .dynamic(&data_volumes())
                    .create(&PostParams::default(), &parse(volume)?)
                    .await?;
            }
            outer
                .dynamic(&virtual_machines())
                .create(&PostParams::default(), &parse(plan.virtual_machine(i))?)
                .await?;
        }
        let mut addresses = Vec::new();
        for i in 0..plan.nodes {
            let name = ClusterPlan::node_name(i);
            let instances = outer.dynamic(&virtual_machine_instances());
            let address = eventually(
                &format!("{name} to get an address"),
                Duration::from_secs(900),
                || async {
                    let Some(vmi) = instances.get_opt(&name).await? else {
                        return Ok(None);
                    };
                    Ok(vmi.data["status"]["interfaces"][0]["ipAddress"]
                        .as_str()
                        .and_then(|a| a.parse::<std::net::IpAddr>().ok()))
                },
            )
            .await?;
            // A VM address must never be one of the outer cluster's own.
            protected
                .talos_target(Some(&address.to_string()))
                .map_err(rail)?;
            addresses.push(address);
        }

        let contract = ichor_render::Contract::from_version(&plan.talos_version)
            .map_err(|e| Error::Spec(e.to_string()))?;
        let bundle = ichor_render::SecretsBundle::generate(contract)
            .map_err(|e| Error::Spec(format!("secrets bundle: {e}")))?;
        let talos_pods = TalosPods::new(outer.clone(), protected.clone(), &options.talosctl_image);
        let mut target = Self {
            outer,
            options,
            protected,
            addresses,
            bundle,
            inner_kubeconfig: String::new(),
            inner: pinned.client().await?,
            relays: Mutex::default(),
            talos_pods,
        };
        for i in 0..plan.nodes {
            target
                .talos(i, &["get", "disks"], true, Duration::from_secs(900))
                .await?;
        }
        target.configure_management().await?;
        target.start_controller().await?;
        Ok(target)
    }

    fn management(&self) -> std::ops::Range<usize> {
        0..self.options.management
    }

    fn endpoint_address(&self) -> std::net::IpAddr {
        self.addresses[0]
    }

    /// Runs `talosctl` against node `i` in a one-shot pod, retrying until `within`.
    async fn talos(
        &self,
        i: usize,
        args: &[&str],
        insecure: bool,
        within: Duration,
    ) -> Result<String, Error> {
        let node = self.addresses.get(i).map(ToString::to_string);
        // A refused target is final; anything else is retried until `within`.
        self.protected.talos_target(node.as_deref()).map_err(rail)?;
        eventually(
            &format!(
                "talosctl {} on {}",
                args.join(" "),
                ClusterPlan::node_name(i)
            ),
            within,
            || async {
                self.talos_once(node.as_deref(), args, insecure)
                    .await
                    .map(Some)
            },
        )
        .await
    }

    /// One `talosctl` run in the one-shot pod: the node is explicit and never protected.
    pub async fn talos_once(
        &self,
        node: Option<&str>,
        args: &[&str],
        insecure: bool,
    ) -> Result<String, Error> {
        self.talos_pods.run(node, args, insecure).await
    }

    /// Renders, applies, bootstraps and checks the management cluster, then installs Ichor's
    /// CRDs, roles, admission policy and namespaces on it.
    async fn configure_management(&mut self) -> Result<(), Error> {
        let plan = self.options.plan.clone();
        let endpoint = ClusterPlan::endpoint(&self.endpoint_address().to_string())
            .map_err(|e| Error::Spec(e.to_string()))?;
        let control_planes = i32::try_from(self.options.management)
            .map_err(|_| Error::Spec("too many management nodes".into()))?;
        let spec = ichor_api::TalosCluster::test("ichor-e2e-management")
            .talos(&plan.talos_version)
            .kubernetes(&self.options.kubernetes_version)
            .endpoint(&endpoint)
            .control_planes(control_planes)
            .subnets(&[&plan.pod_subnet], &[&plan.service_subnet])
            .install_disk("/dev/vda")
            .installer(&plan.installer_image())
            .spec();
        let mut data = BTreeMap::new();
        let addresses: Vec<String> = self
            .management()
            .map(|i| self.addresses[i].to_string())
            .collect();
        let talosconfig = ichor_render::credentials::talosconfig(
            &self.bundle,
            "ichor-e2e-management",
            &addresses,
            &addresses,
        )
        .map_err(|e| Error::Spec(e.to_string()))?;
        data.insert("talosconfig".to_owned(), talosconfig.0);
        for i in self.management() {
            let hostname = ClusterPlan::node_name(i);
            let rendered = ichor_render::render(&ichor_render::RenderInput {
                hostname: Some(&hostname),
                install: spec.install.as_ref(),
                schematic: None,
                oldest_running: None,
                kubernetes: None,
                ..ichor_render::RenderInput::plain(
                    "ichor-e2e-management",
                    &spec,
                    ichor_api::common::Role::ControlPlane,
                    &self.bundle,
                )
            })
            .map_err(|e| Error::Spec(format!("render {hostname}: {e}")))?;
            data.insert(format!("{hostname}.yaml"), rendered.yaml);
        }
        let secret = Secret {
            metadata: ObjectMeta {
                name: Some(TALOS_SECRET.into()),
                namespace: Some(E2E_NAMESPACE.into()),
                labels: Some(BTreeMap::from([(PART_OF.0.into(), PART_OF.1.into())])),
                ..Default::default()
            },
            string_data: Some(data),
            ..Default::default()
        };
        self.outer
            .api::<Secret>()
            .create(&PostParams::default(), &secret)
            .await?;

        for i in self.management() {
            let file = format!("/talos/{}.yaml", ClusterPlan::node_name(i));
            self.talos(
                i,
                &["apply-config", "--file", &file],
                true,
                Duration::from_secs(300),
            )
            .await?;
        }
        // Installed and rebooted from disk: the mTLS API answers. Then the ISO goes.
        for i in self.management() {
            self.talos(i, &["version"], false, Duration::from_secs(1200))
                .await?;
            self.detach_iso(i).await?;
        }
        // Bootstrap once, retried while etcd is not ready for it (FailedPrecondition).
        let first = self.addresses[0].to_string();
        eventually("bootstrap", Duration::from_secs(600), || async {
            match self.talos_once(Some(&first), &["bootstrap"], false).await {
                Ok(_) => Ok(Some(())),
                Err(e) if e.to_string().contains("AlreadyExists") => Ok(Some(())),
                Err(e) if e.to_string().contains("FailedPrecondition") => Ok(None),
                Err(e) => Err(e),
            }
        })
        .await?;
        // Ready as the node itself reports it: MachineStatus spec.status.ready.
        for i in self.management() {
            let node = self.addresses[i].to_string();
            eventually(
                &format!("{} to report ready", ClusterPlan::node_name(i)),
                Duration::from_secs(900),
                || async {
                    let out = self
                        .talos_once(
                            Some(&node),
                            &["get", "machinestatus", "--output", "json"],
                            false,
                        )
                        .await?;
                    Ok(machine_ready(&out).then_some(()))
                },
            )
            .await?;
        }
        if self.options.management == 3 {
            let out = self
                .talos(0, &["etcd", "members"], false, Duration::from_secs(300))
                .await?;
            let voters = etcd_voters(&out)?;
            if voters != 3 {
                return Err(Error::Spec(format!(
                    "etcd has {voters} voters, not 3:\n{out}"
                )));
            }
        }

        let port = self.relay(0).await?;
        let admin = ichor_render::credentials::admin_kubeconfig(
            &self.bundle,
            "ichor-e2e-management",
            &endpoint,
        )
        .map_err(|e| Error::Spec(e.to_string()))?;
        self.inner_kubeconfig = rewrite_kubeconfig(
            &admin.0,
            &format!("https://127.0.0.1:{port}"),
            Some(&first),
            None,
        )?;
        self.inner = client_from(&self.inner_kubeconfig).await?;
        install_ichor(&self.inner).await?;
        Ok(())
    }

    /// Drops node `i`'s ISO from its VM (effective from its next start) and deletes the ISO
    /// volume: an installed node boots from its disk.
    pub async fn detach_iso(&self, i: usize) -> Result<(), Error> {
        let node = ClusterPlan::node_name(i);
        let vms = self.outer.dynamic(&virtual_machines());
        let vm = vms.get(&node).await?;
        let template = &vm.data["spec"]["template"]["spec"];
        let keep = |list: &Value| -> Value {
            Value::Array(
                list.as_array()
                    .map(|l| l.iter().filter(|d| d["name"] != "iso").cloned().collect())
                    .unwrap_or_default(),
            )
        };
        let patch = json!({"spec": {"template": {"spec": {
            "domain": {"devices": {"disks": keep(&template["domain"]["devices"]["disks"])}},
            "volumes": keep(&template["volumes"]),
        }}}});
        vms.patch(&node, &PatchParams::default(), &Patch::Merge(&patch))
            .await?;
        self.outer
            .delete_dynamic(&data_volumes(), E2E_NAMESPACE, &format!("{node}-iso"))
            .await
    }

    /// A local port forwarding, through relay pod `i`, to node `i`'s apiserver.
    async fn relay(&self, i: usize) -> Result<u16, Error> {
        let mut relays = self.relays.lock().await;
        if let Some(relay) = relays.get(&i)
            && !relay.task.is_finished()
        {
            return Ok(relay.port);
        }
        let pods: Api<Pod> = self.outer.api();
        let name = relay_name(i);
        if pods.get_opt(&name).await?.is_none() {
            let manifest = relay_pod(&self.options.relay_image, i, self.addresses[i]);
            pods.create(&PostParams::default(), &parse(manifest)?)
                .await?;
        }
        eventually(
            &format!("{name} to run"),
            Duration::from_secs(300),
            || async {
                let phase = pods
                    .get(&name)
                    .await?
                    .status
                    .and_then(|s| s.phase)
                    .unwrap_or_default();
                Ok((phase == "Running").then_some(()))
            },
        )
        .await?;
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
        let port = listener.local_addr()?.port();
        let task = tokio::spawn(async move {
            while let Ok((mut local, _)) = listener.accept().await {
                let pods = pods.clone();
                let name = name.clone();
                tokio::spawn(async move {
                    let Ok(mut forwarder) = pods.portforward(&name, &[APISERVER_PORT]).await else {
                        return;
                    };
                    if let Some(mut remote) = forwarder.take_stream(APISERVER_PORT) {
                        let _ = tokio::io::copy_bidirectional(&mut local, &mut remote).await;
                    }
                    drop(forwarder);
                });
            }
        });
        relays.insert(i, Relay { port, task });
        Ok(port)
    }

    /// Starts the controller pod on the outer cluster's pod network, copies the binaries and
    /// kubeconfigs in, and registers the webhook by the pod's IP on the inner cluster.
    async fn start_controller(&mut self) -> Result<(), Error> {
        let pods: Api<Pod> = self.outer.api();
        pods.create(
            &PostParams::default(),
            &parse(ClusterPlan::controller_pod(&self.options.pod_image))?,
        )
        .await?;
        let pod_ip = eventually(
            "the controller pod to run",
            Duration::from_secs(300),
            || async {
                let status = pods.get(CONTROLLER_POD).await?.status.unwrap_or_default();
                Ok((status.phase.as_deref() == Some("Running"))
                    .then_some(status.pod_ip)
                    .flatten())
            },
        )
        .await?;

        let real_server = format!("https://{}:{APISERVER_PORT}", self.endpoint_address());
        let mut files: Vec<(String, Vec<u8>)> = Vec::new();
        for name in [admission::MANAGER_NAME, admission::WEBHOOK_NAME] {
            let token = service_account_token(&self.inner, name).await?;
            let kubeconfig =
                rewrite_kubeconfig(&self.inner_kubeconfig, &real_server, None, Some(&token))?;
            let short = name.trim_start_matches("ichor-");
            files.push((format!("{short}.kubeconfig"), kubeconfig.into_bytes()));
        }
        for name in ["ichor-manager", "ichor-webhook"] {
            files.push((
                name.into(),
                std::fs::read(self.options.binaries.join(name))?,
            ));
        }
        files.push(("start".into(), start_script().into_bytes()));
        for (name, bytes) in files {
            copy_into(&pods, &name, &bytes).await?;
        }

        let url = ClusterPlan::webhook_url(&pod_ip, admission::WEBHOOK_PATH)
            .map_err(|e| Error::Spec(e.to_string()))?;
        register_webhook(&self.inner, &url).await
    }
}

/// Registers the shipped webhook configuration on the management cluster, called at `url`,
/// and waits until the webhook has injected its CA.
pub(crate) async fn register_webhook(inner: &kube::Client, url: &str) -> Result<(), Error> {
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(inner.clone());
    let mut config = admission::validating_webhook_configuration();
    for hook in config.webhooks.iter_mut().flatten() {
        hook.client_config = WebhookClientConfig {
            url: Some(url.to_owned()),
            ..Default::default()
        };
    }
    configs
        .patch(
            admission::WEBHOOK_CONFIGURATION,
            &PatchParams::apply(FIELD_MANAGER).force(),
            &Patch::Apply(&config),
        )
        .await?;
    // Polled briskly: the sim target waits on this at every start.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(120);
    loop {
        let injected = configs
            .get(admission::WEBHOOK_CONFIGURATION)
            .await?
            .webhooks
            .unwrap_or_default()
            .iter()
            .all(|w| {
                w.client_config
                    .ca_bundle
                    .as_ref()
                    .is_some_and(|b| !b.0.is_empty())
            });
        if injected {
            return Ok(());
        }
        if tokio::time::Instant::now() > deadline {
            return Err(Error::Binary("the webhook never injected its CA".into()));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Writes `bytes` to `/ichor/<name>` in the controller pod (through a temporary name, so the
/// start script never sees half a file).
async fn copy_into(pods: &Api<Pod>, name: &str, bytes: &[u8]) -> Result<(), Error> {
    let script = format!(
        "cat > /ichor/.{name}.part && chmod 0755 /ichor/.{name}.part && mv /ichor/.{name}.part /ichor/{name}"
    );
    let mut attached = pods
        .exec(
            CONTROLLER_POD,
            ["sh", "-c", script.as_str()],
            &AttachParams::default()
                .stdin(true)
                .stdout(false)
                .stderr(true),
        )
        .await?;
    let status = attached.take_status();
    let mut stdin = attached
        .stdin()
        .ok_or_else(|| Error::Spec("exec without stdin".into()))?;
    stdin.write_all(bytes).await?;
    stdin.shutdown().await?;
    drop(stdin);
    let result = match status {
        Some(status) => status.await,
        None => None,
    };
    attached
        .join()
        .await
        .map_err(|e| Error::Spec(format!("copy {name}: {e}")))?;
    match result {
        Some(s) if s.status.as_deref() != Some("Success") => Err(Error::Spec(format!(
            "copy {name} into {CONTROLLER_POD}: {}",
            s.message.unwrap_or_default()
        ))),
        _ => Ok(()),
    }
}

/// A client from a kubeconfig's text (its current context).
pub(crate) async fn client_from(kubeconfig: &str) -> Result<kube::Client, Error> {
    let config =
        Kubeconfig::from_yaml(kubeconfig).map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
    let config = kube::Config::from_custom_kubeconfig(config, &Default::default())
        .await
        .map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
    Ok(kube::Client::try_from(config)?)
}

/// A day-long token for the ServiceAccount `name` in the inner system namespace.
pub(crate) async fn service_account_token(
    inner: &kube::Client,
    name: &str,
) -> Result<String, Error> {
    let request = TokenRequest {
        spec: Some(TokenRequestSpec {
            expiration_seconds: Some(24 * 3600),
            ..Default::default()
        }),
        ..Default::default()
    };
    let response = Api::<ServiceAccount>::namespaced(inner.clone(), INNER_SYSTEM_NAMESPACE)
        .create_token_request(name, &PostParams::default(), &request)
        .await?;
    response
        .status
        .and_then(|s| s.token)
        .ok_or_else(|| Error::Spec(format!("no token for {name}")))
}

/// Ichor's CRDs, namespaces, ServiceAccounts bound to the shipped roles, and the kube-proxy
/// admission policy, on the inner (management) cluster. Nothing here deletes.
pub(crate) async fn install_ichor(inner: &kube::Client) -> Result<(), Error> {
    let apply = PatchParams::apply(FIELD_MANAGER).force();
    for name in [E2E_NAMESPACE, INNER_SYSTEM_NAMESPACE] {
        let namespace = Namespace {
            metadata: ObjectMeta {
                name: Some(name.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(inner.clone())
            .patch(name, &apply, &Patch::Apply(&namespace))
            .await?;
    }
    let crds: Api<CustomResourceDefinition> = Api::all(inner.clone());
    for crd in ichor_api::crds() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(&name, &apply, &Patch::Apply(&crd)).await?;
        eventually(
            &format!("CRD {name} to be established"),
            Duration::from_secs(60),
            || async {
                let established = crds
                    .get(&name)
                    .await?
                    .status
                    .and_then(|s| s.conditions)
                    .unwrap_or_default()
                    .iter()
                    .any(|c| c.type_ == "Established" && c.status == "True");
                Ok(established.then_some(()))
            },
        )
        .await?;
    }
    let policies =
        Api::<k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicy>::all(
            inner.clone(),
        );
    let policy = admission::kube_proxy_switch_policy();
    policies
        .patch(
            &policy.metadata.name.clone().unwrap_or_default(),
            &apply,
            &Patch::Apply(&policy),
        )
        .await?;
    let bindings = Api::<
        k8s_openapi::api::admissionregistration::v1::ValidatingAdmissionPolicyBinding,
    >::all(inner.clone());
    let binding = admission::kube_proxy_switch_binding();
    bindings
        .patch(
            &binding.metadata.name.clone().unwrap_or_default(),
            &apply,
            &Patch::Apply(&binding),
        )
        .await?;
    for (name, cluster_role, role) in [
        (
            admission::MANAGER_NAME,
            admission::manager_cluster_role(),
            admission::manager_role(INNER_SYSTEM_NAMESPACE),
        ),
        (
            admission::WEBHOOK_NAME,
            admission::webhook_cluster_role(),
            admission::webhook_role(INNER_SYSTEM_NAMESPACE),
        ),
    ] {
        let account = ServiceAccount {
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some(INNER_SYSTEM_NAMESPACE.into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<ServiceAccount>::namespaced(inner.clone(), INNER_SYSTEM_NAMESPACE)
            .patch(name, &apply, &Patch::Apply(&account))
            .await?;
        let subject = k8s_openapi::api::rbac::v1::Subject {
            kind: "ServiceAccount".into(),
            name: name.into(),
            namespace: Some(INNER_SYSTEM_NAMESPACE.into()),
            ..Default::default()
        };
        crate::sim::bind_subject(
            inner,
            INNER_SYSTEM_NAMESPACE,
            name,
            cluster_role,
            role,
            subject,
        )
        .await?;
    }
    Ok(())
}

/// Whether `talosctl get machinestatus -o json` says the node is ready (`spec.status.ready`).
pub fn machine_ready(output: &str) -> bool {
    serde_json::Deserializer::from_str(output)
        .into_iter::<Value>()
        .filter_map(Result::ok)
        .any(|v| v["spec"]["status"]["ready"] == json!(true))
}

/// The voters in `talosctl etcd members` output: a table whose last column is `LEARNER`
/// (`false` for voters; other headers hold spaces, so rows are read from the end). Fails when
/// the table has no such column.
pub fn etcd_voters(output: &str) -> Result<usize, Error> {
    let mut lines = output.lines().filter(|l| !l.trim().is_empty());
    let header_ok = lines
        .next()
        .and_then(|h| h.split_whitespace().last())
        .is_some_and(|c| c == "LEARNER");
    if !header_ok {
        return Err(Error::Spec(format!(
            "no LEARNER column in talosctl etcd members: {output}"
        )));
    }
    Ok(lines
        .filter(|l| l.split_whitespace().last() == Some("false"))
        .count())
}

impl Target for ClusterTarget {
    fn kubeconfig(&self) -> &str {
        &self.inner_kubeconfig
    }

    fn context(&self) -> &str {
        "admin@ichor-e2e-management"
    }

    fn node_endpoints(&self) -> Vec<String> {
        self.addresses[self.options.management..]
            .iter()
            .map(ToString::to_string)
            .collect()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            faults: false,
            kill_points: false,
        }
    }

    fn namespace(&self) -> &str {
        E2E_NAMESPACE
    }

    fn client(&self) -> kube::Client {
        self.inner.clone()
    }

    async fn kubelets_registered(&self, _cluster: &str) -> Result<(), Error> {
        // Real kubelets register their Nodes themselves.
        Ok(())
    }

    fn installer_image(&self) -> Option<String> {
        Some(self.options.plan.installer_image())
    }

    async fn reachable(&self, kubeconfig: &str) -> Result<String, Error> {
        let config = Kubeconfig::from_yaml(kubeconfig)
            .map_err(|e| Error::Spec(format!("kubeconfig: {e}")))?;
        let server = config
            .clusters
            .first()
            .and_then(|c| c.cluster.as_ref())
            .and_then(|c| c.server.clone())
            .unwrap_or_default();
        let host = server
            .trim_start_matches("https://")
            .rsplit_once(':')
            .map(|(h, _)| h.to_owned())
            .unwrap_or_default();
        let index = self
            .addresses
            .iter()
            .position(|a| a.to_string() == host)
            .ok_or_else(|| {
                Error::Spec(format!(
                    "{server} is not a node of this target: no relay for it"
                ))
            })?;
        let port = self.relay(index).await?;
        rewrite_kubeconfig(
            kubeconfig,
            &format!("https://127.0.0.1:{port}"),
            Some(&host),
            None,
        )
    }
}

impl Drop for ClusterTarget {
    fn drop(&mut self) {
        if let Ok(relays) = self.relays.try_lock() {
            for relay in relays.values() {
                relay.task.abort();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn plan() -> ClusterPlan {
        ClusterPlan {
            talos_version: "v1.14.1".into(),
            iso_schematic: "iso".into(),
            installer_schematic: "installer".into(),
            nodes: 3,
            storage_class: None,
            pod_subnet: "10.244.0.0/16".into(),
            service_subnet: "10.96.0.0/12".into(),
            outer_subnets: vec![],
        }
    }

    #[test]
    fn down_names_every_object_in_the_e2e_namespace() {
        let names = object_names(&plan());
        assert!(names.iter().all(|(kind, name)| {
            crate::rails::check_delete(&kind.kind, E2E_NAMESPACE, name).is_ok()
        }));
        for expected in [
            "talos-3",
            "talos-3-iso",
            "talos-3-disk",
            "ichor-relay-3",
            CONTROLLER_POD,
            TALOSCTL_POD,
            TALOS_SECRET,
        ] {
            assert!(names.iter().any(|(_, n)| n == expected), "{expected}");
        }
    }

    #[test]
    fn talosctl_pods_name_their_node_as_node_and_endpoint() {
        let pod = talosctl_pod(
            "talosctl:v1.14.1",
            "10.42.0.9".parse().expect("ip"),
            &["get", "disks"],
            true,
        );
        let args: Vec<&str> = pod["spec"]["containers"][0]["args"]
            .as_array()
            .expect("args")
            .iter()
            .filter_map(Value::as_str)
            .collect();
        assert_eq!(
            args,
            [
                "--nodes",
                "10.42.0.9",
                "--endpoints",
                "10.42.0.9",
                "get",
                "disks",
                "--insecure"
            ]
        );
        let secure = talosctl_pod("t", "10.42.0.9".parse().expect("ip"), &["version"], false);
        assert_eq!(secure["spec"]["containers"][0]["args"][0], "--talosconfig");
        assert_eq!(secure["metadata"]["namespace"], E2E_NAMESPACE);
    }

    #[test]
    fn readiness_and_voters_are_read_from_talos_output() {
        assert!(machine_ready(
            r#"{"node":"10.0.0.1","spec":{"stage":"running","status":{"ready":true}}}"#
        ));
        assert!(!machine_ready(
            r#"{"spec":{"stage":"booting","status":{"ready":false}}}"#
        ));
        let table = "NODE        ID    HOSTNAME  PEER URLS  CLIENT URLS  LEARNER\n\
                     10.0.0.1    a1    talos-1   https://a  https://a    false\n\
                     10.0.0.1    a2    talos-2   https://b  https://b    false\n\
                     10.0.0.1    a3    talos-3   https://c  https://c    true\n";
        assert_eq!(etcd_voters(table).expect("table"), 2);
        assert!(etcd_voters("garbage").is_err());
    }

    #[test]
    fn kubeconfigs_are_rewritten_to_the_real_address_or_the_relay() {
        let base = "apiVersion: v1\nkind: Config\nclusters:\n- name: c\n  cluster:\n    server: https://127.0.0.1:4000\n    tls-server-name: 10.42.0.9\n    certificate-authority-data: Zm9v\nusers:\n- name: u\n  user:\n    client-certificate-data: Zm9v\n    client-key-data: Zm9v\ncontexts:\n- name: u\n  context:\n    cluster: c\n    user: u\ncurrent-context: u\n";
        let rewritten =
            rewrite_kubeconfig(base, "https://10.42.0.9:6443", None, Some("tok")).expect("rewrite");
        let config = Kubeconfig::from_yaml(&rewritten).expect("yaml");
        let cluster = config.clusters[0].cluster.as_ref().expect("cluster");
        assert_eq!(cluster.server.as_deref(), Some("https://10.42.0.9:6443"));
        assert_eq!(cluster.tls_server_name, None);
        let user = config.auth_infos[0].auth_info.as_ref().expect("user");
        assert!(user.client_key_data.is_none());
        assert!(user.token.is_some());
        assert!(start_script().contains("--namespace ichor-system"));
        assert!(start_script().contains("--pod-ip \"$POD_IP\""));
    }
}
