//! The Kubernetes control plane of a simulated workload cluster: etcd, kube-apiserver serving on
//! the cluster endpoint with a certificate from the cluster's own Kubernetes CA,
//! kube-controller-manager (garbage collection, disruption budgets, node lifecycle, namespaces,
//! service accounts …) and kwok playing every node's kubelet.
//!
//! The apiserver trusts client certificates issued by that same CA, so an admin kubeconfig
//! minted from a Talos secrets bundle (`O=system:masters`, signed by the bundle's Kubernetes CA)
//! works against it as it would against the real cluster. Nodes appear when something registers
//! them ([`register_node`], what a kubelet does on first boot); kwok then marks them Ready,
//! keeps their Leases fresh, runs the Pods bound to them and removes deleted Pods.
//!
//! Processes and folder are handled as for [`ControlPlane`](crate::ControlPlane): process
//! groups, a parent-death signal, and a watchdog, so nothing outlives the test.

use std::collections::BTreeMap;
use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{
    Node, NodeAddress, NodeSpec, NodeStatus, NodeSystemInfo, ServiceAccount, Taint,
};
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};

use crate::assets;
use crate::control_plane::{
    args, client_from_kubeconfig, default_assets_dir, http_get, kubeconfig_yaml, start_etcd,
    start_process, stop_process, tool_versions, wait_readyz, write,
};
use crate::pki::{self, CertAndKey};
use crate::ports::Starts;
use crate::process::{ChildSpec, Supervised, Watchdog};
use crate::{CA_CERT_FILE, CA_KEY_FILE, Error, KUBECONFIG_FILE};

/// The stages kwok plays: node Ready and heartbeat, pod Running, Job pod Succeeded, pod removal.
const KWOK_STAGES: &str = include_str!("kwok-stages.yaml");

/// How long kube-controller-manager and kwok may take to start working.
const COMPONENTS_TIMEOUT: Duration = Duration::from_secs(90);

/// The Lease duration kwok gives each node, as a kubelet's default.
const NODE_LEASE_SECONDS: u32 = 40;

/// Controllers left out of kube-controller-manager: those that need a cloud provider.
const NO_CLOUD_CONTROLLERS: &str =
    "*,-cloud-node-lifecycle-controller,-service-lb-controller,-node-route-controller";

/// What to start: where the apiserver serves, and the cluster's Kubernetes CA.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct WorkloadSpec {
    /// The cluster endpoint the apiserver listens on, e.g. `127.0.31.1:6443` (port 0: any free
    /// port on that address).
    pub endpoint: SocketAddr,
    /// The cluster's Kubernetes CA (certificate and key, PEM): it issues the apiserver's serving
    /// certificate and every client certificate the apiserver accepts.
    pub ca: CertAndKey,
    /// The cluster's name (kube-controller-manager's `--cluster-name`).
    pub cluster_name: String,
    /// The Service network; its first address is in the serving certificate.
    pub service_cidr: String,
    /// The network kwok hands Pod IPs out of.
    pub pod_cidr: String,
    /// The cluster DNS domain, for the `kubernetes.default.svc.<domain>` name.
    pub dns_domain: String,
    /// More names (IP addresses or DNS names) for the serving certificate.
    pub extra_sans: Vec<String>,
    /// Where the binaries are; default: as for [`ControlPlane`](crate::ControlPlane).
    pub assets_dir: Option<PathBuf>,
    /// Extra `--flag=value` arguments for kube-apiserver.
    pub apiserver_args: Vec<String>,
    /// Extra `--flag=value` arguments for kube-controller-manager.
    pub controller_manager_args: Vec<String>,
    /// Extra `--flag=value` arguments for kwok.
    pub kwok_args: Vec<String>,
}

impl WorkloadSpec {
    /// A spec for a cluster served at `endpoint` with Kubernetes CA `ca`, other fields defaulted.
    pub fn new(endpoint: SocketAddr, ca: CertAndKey) -> Self {
        Self {
            endpoint,
            ca,
            cluster_name: "ichor-workload".into(),
            service_cidr: "10.96.0.0/12".into(),
            pod_cidr: "10.244.0.0/16".into(),
            dns_domain: "cluster.local".into(),
            extra_sans: Vec::new(),
            assets_dir: None,
            apiserver_args: Vec::new(),
            controller_manager_args: Vec::new(),
            kwok_args: Vec::new(),
        }
    }

    /// Sets the cluster's name.
    pub fn cluster_name(mut self, name: impl Into<String>) -> Self {
        self.cluster_name = name.into();
        self
    }

    /// Takes binaries from `dir`.
    pub fn assets_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.assets_dir = Some(dir.into());
        self
    }
}

/// A running workload control plane. Dropping it (or [`stop`](Self::stop)) kills every process
/// and removes its folder. Its apiserver alone can be stopped and started again
/// ([`stop_apiserver`](Self::stop_apiserver), [`start_apiserver`](Self::start_apiserver)): an
/// outage of the workload API with everything it stored kept.
pub struct WorkloadControlPlane {
    // Field order is drop order: kwok and the controller manager go first, then the apiserver
    // and etcd, then the watchdog removes the folder.
    kwok: Supervised,
    controller_manager: Supervised,
    /// `None` while stopped.
    apiserver: Option<Supervised>,
    etcd: Supervised,
    /// What starts the apiserver again: its binaries' folder and its arguments.
    assets_dir: PathBuf,
    apiserver_args: Vec<String>,
    endpoint: SocketAddr,
    server: String,
    kubeconfig: String,
    ca: CertAndKey,
    client: Client,
    _watchdog: Watchdog,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for WorkloadControlPlane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WorkloadControlPlane")
            .field("server", &self.server)
            .field("dir", &self.dir.path())
            .field("pids", &self.pids())
            .finish_non_exhaustive()
    }
}

/// The files of a workload control plane's folder, by purpose.
mod files {
    pub const APISERVER_CERT: &str = "apiserver.crt";
    pub const APISERVER_KEY: &str = "apiserver.key";
    pub const SA_KEY: &str = "sa.key";
    pub const SA_PUB: &str = "sa.pub";
    pub const CONTROLLER_MANAGER_KUBECONFIG: &str = "controller-manager.kubeconfig";
    pub const KWOK_KUBECONFIG: &str = "kwok.kubeconfig";
    pub const KWOK_STAGES: &str = "kwok-stages.yaml";
}

impl WorkloadControlPlane {
    /// Starts etcd, kube-apiserver, kube-controller-manager and kwok, and waits until the
    /// apiserver is ready, the controller manager has created the `default` ServiceAccount and
    /// kwok answers its health check.
    pub async fn start(spec: WorkloadSpec) -> Result<Self, Error> {
        let assets_dir = spec.assets_dir.clone().unwrap_or_else(default_assets_dir);
        let missing = assets::missing_workload_binaries(&assets_dir);
        if !missing.is_empty() {
            return Err(Error::MissingAssets {
                dir: assets_dir,
                missing: missing.join(", "),
            });
        }
        let dir = tempfile::Builder::new()
            .prefix("ichor-workload-")
            .tempdir()
            .map_err(Error::io("create a temporary folder"))?;
        let root = dir.path().to_path_buf();
        let watchdog = Watchdog::start(&root).map_err(Error::io("start the watchdog"))?;

        let issuer = pki::issuer_from_pem(&spec.ca)?;
        // The key as PKCS#8, which kube-controller-manager's CSR signer reads whatever the
        // caller's PEM label was.
        let ca_key_pkcs8 = pki::key_pair_from_pem(&spec.ca.key_pem)?.serialize_pem();
        let serving = pki::server_cert_signed_by(
            &issuer,
            "kube-apiserver",
            &serving_names(&spec, spec.endpoint.ip()),
        )?;
        let admin = pki::client_cert_signed_by(&issuer, "admin", Some("system:masters"))?;
        // With `--use-service-account-credentials=false` every controller acts as the controller
        // manager itself, so it needs more than the bootstrap `system:kube-controller-manager`
        // role grants (the garbage collector deletes anything).
        let controller_manager = pki::client_cert_signed_by(
            &issuer,
            "system:kube-controller-manager",
            Some("system:masters"),
        )?;
        let kwok = pki::client_cert_signed_by(&issuer, "system:kwok", Some("system:masters"))?;
        let (sa_key, sa_pub) = pki::service_account_keys()?;
        for (name, contents) in [
            (CA_CERT_FILE, spec.ca.cert_pem.as_str()),
            (CA_KEY_FILE, ca_key_pkcs8.as_str()),
            (files::APISERVER_CERT, serving.cert_pem.as_str()),
            (files::APISERVER_KEY, serving.key_pem.as_str()),
            (files::SA_KEY, sa_key.as_str()),
            (files::SA_PUB, sa_pub.as_str()),
            (files::KWOK_STAGES, KWOK_STAGES),
        ] {
            write(&root.join(name), contents)?;
        }
        let p = |name: &str| root.join(name).display().to_string();

        let etcd = start_etcd(&assets_dir, &root).await?;
        let mut etcd_process = etcd.process;
        let ip = spec.endpoint.ip();
        // The port-dependent `--secure-port` and `--service-account-issuer` come first, so
        // that the caller's arguments (last) still override any of these.
        let mut common_args = vec![
            format!("--etcd-servers={}", etcd.url),
            format!("--bind-address={ip}"),
            format!("--advertise-address={ip}"),
            format!("--cert-dir={}", p("apiserver-certs")),
            format!("--tls-cert-file={}", p(files::APISERVER_CERT)),
            format!("--tls-private-key-file={}", p(files::APISERVER_KEY)),
            format!("--client-ca-file={}", p(CA_CERT_FILE)),
            "--authorization-mode=Node,RBAC".into(),
            "--enable-admission-plugins=NodeRestriction".into(),
            format!("--service-account-key-file={}", p(files::SA_PUB)),
            format!("--service-account-signing-key-file={}", p(files::SA_KEY)),
            format!("--service-cluster-ip-range={}", spec.service_cidr),
            "--allow-privileged=true".into(),
            "--enable-priority-and-fairness=false".into(),
            // The `kubernetes` Service's Endpoints may not hold a loopback address, which every
            // simulated endpoint is: leave them out rather than fail to write them forever.
            "--endpoint-reconciler-type=none".into(),
        ];
        common_args.extend(spec.apiserver_args.iter().cloned());
        let mut starts = Starts::at("kube-apiserver", spec.endpoint);
        let (mut apiserver, apiserver_args, endpoint, client) = loop {
            let port = starts.next().await?[0];
            let started: Result<_, Error> = async {
                let endpoint = SocketAddr::new(ip, port);
                let mut arguments = vec![
                    format!("--secure-port={port}"),
                    format!("--service-account-issuer=https://{endpoint}"),
                ];
                arguments.extend(common_args.iter().cloned());
                let mut apiserver =
                    spawn_component(&assets_dir, "kube-apiserver", &arguments, &root, Vec::new())?;
                let kubeconfig = kubeconfig_yaml(&format!("https://{endpoint}"), &spec.ca, &admin);
                let ready = match client_from_kubeconfig(&kubeconfig).await {
                    Ok(client) => wait_readyz(&client, &mut [&mut etcd_process, &mut apiserver])
                        .await
                        .map(|()| client),
                    Err(error) => Err(error),
                };
                match ready {
                    Ok(client) => Ok((apiserver, arguments, endpoint, client)),
                    Err(error) => {
                        stop_process(&mut Some(apiserver), "kube-apiserver", &root)?;
                        Err(error)
                    }
                }
            }
            .await;
            match started {
                Ok(started) => break started,
                Err(error) => starts.retry(error)?,
            }
        };
        let server = format!("https://{endpoint}");
        let kubeconfig = kubeconfig_yaml(&server, &spec.ca, &admin);
        for (name, contents) in [
            (KUBECONFIG_FILE, kubeconfig.clone()),
            (
                files::CONTROLLER_MANAGER_KUBECONFIG,
                kubeconfig_yaml(&server, &spec.ca, &controller_manager),
            ),
            (
                files::KWOK_KUBECONFIG,
                kubeconfig_yaml(&server, &spec.ca, &kwok),
            ),
        ] {
            write(&root.join(name), &contents)?;
        }

        let mut controller_manager_args = vec![
            format!("--kubeconfig={}", p(files::CONTROLLER_MANAGER_KUBECONFIG)),
            "--bind-address=127.0.0.1".into(),
            // No HTTPS endpoint: nothing scrapes it, and two planes must not race for a port.
            "--secure-port=0".into(),
            "--leader-elect=false".into(),
            format!("--controllers={NO_CLOUD_CONTROLLERS}"),
            "--use-service-account-credentials=false".into(),
            format!("--service-account-private-key-file={}", p(files::SA_KEY)),
            format!("--root-ca-file={}", p(CA_CERT_FILE)),
            format!("--cluster-signing-cert-file={}", p(CA_CERT_FILE)),
            format!("--cluster-signing-key-file={}", p(CA_KEY_FILE)),
            format!("--cluster-name={}", spec.cluster_name),
        ];
        controller_manager_args.extend(spec.controller_manager_args.iter().cloned());
        // It serves nothing (`--secure-port=0`), so it needs no port and no retry.
        let mut controller_manager = spawn_component(
            &assets_dir,
            "kube-controller-manager",
            &controller_manager_args,
            &root,
            Vec::new(),
        )?;

        let kwok_home = root.join("kwok-home");
        std::fs::create_dir_all(&kwok_home).map_err(Error::io("create kwok's home folder"))?;
        let mut starts = Starts::fresh("kwok", 1);
        let kwok = loop {
            let ports = starts.next().await?;
            let started: Result<_, Error> = async {
                let mut kwok_args = vec![
                    format!("--kubeconfig={}", p(files::KWOK_KUBECONFIG)),
                    format!("--config={}", p(files::KWOK_STAGES)),
                    "--manage-all-nodes=true".into(),
                    format!("--node-lease-duration-seconds={NODE_LEASE_SECONDS}"),
                    format!("--cidr={}", spec.pod_cidr),
                    format!("--server-address=127.0.0.1:{}", ports[0]),
                ];
                kwok_args.extend(spec.kwok_args.iter().cloned());
                // kwok reads `~/.kwok/kwok.yaml` when it exists: give it a home of its own.
                let mut kwok = spawn_component(
                    &assets_dir,
                    "kwok",
                    &kwok_args,
                    &root,
                    vec![("HOME".into(), kwok_home.clone().into_os_string())],
                )?;
                let working = wait_components(
                    &client,
                    ports[0],
                    &mut [
                        &mut etcd_process,
                        &mut apiserver,
                        &mut controller_manager,
                        &mut kwok,
                    ],
                )
                .await;
                match working {
                    Ok(()) => Ok(kwok),
                    Err(error) => {
                        stop_process(&mut Some(kwok), "kwok", &root)?;
                        Err(error)
                    }
                }
            }
            .await;
            match started {
                Ok(started) => break started,
                Err(error) => starts.retry(error)?,
            }
        };

        Ok(Self {
            kwok,
            controller_manager,
            apiserver: Some(apiserver),
            etcd: etcd_process,
            assets_dir,
            apiserver_args,
            endpoint,
            server,
            kubeconfig,
            ca: spec.ca,
            client,
            _watchdog: watchdog,
            dir,
        })
    }

    /// The apiserver's URL, `https://<endpoint>`.
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The address the apiserver listens on.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// An admin kubeconfig (YAML): user `admin` in `system:masters`, signed by the cluster's CA.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// A kubeconfig (YAML) that presents `client_cert` and trusts the cluster's CA.
    pub fn kubeconfig_with(&self, client_cert: &CertAndKey) -> String {
        kubeconfig_yaml(&self.server, &self.ca, client_cert)
    }

    /// A client that presents `client_cert` (e.g. one minted from a Talos secrets bundle).
    pub async fn client_with(&self, client_cert: &CertAndKey) -> Result<Client, Error> {
        client_from_kubeconfig(&self.kubeconfig_with(client_cert)).await
    }

    /// The folder holding its certificates, kubeconfigs, data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process ids (each also its process group) of etcd, kube-apiserver (0 while it is
    /// stopped), kube-controller-manager and kwok.
    pub fn pids(&self) -> [u32; 4] {
        [
            self.etcd.pid(),
            self.apiserver.as_ref().map_or(0, Supervised::pid),
            self.controller_manager.pid(),
            self.kwok.pid(),
        ]
    }

    /// Registers a Node as its kubelet would (see [`register_node`]).
    pub async fn register_node(&self, node: &NodeRegistration) -> Result<Node, Error> {
        register_node(&self.client, node).await
    }

    /// Waits until the Node `name` is Ready (see [`wait_node_ready`]).
    pub async fn wait_node_ready(&self, name: &str, timeout: Duration) -> Result<Node, Error> {
        wait_node_ready(&self.client, name, timeout).await
    }

    /// Stops kube-apiserver alone: the workload API stops answering at its endpoint, while etcd
    /// keeps every object (Nodes included) and the other components wait for it to return.
    pub fn stop_apiserver(&mut self) -> Result<(), Error> {
        stop_process(&mut self.apiserver, "kube-apiserver", self.dir.path())
    }

    /// Starts kube-apiserver again after [`stop_apiserver`](Self::stop_apiserver), on the same
    /// endpoint with the same certificates and etcd, so every kubeconfig still works; waits
    /// until it is ready. Nothing happens while it runs.
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        if self.apiserver.is_some() {
            return Ok(());
        }
        let root = self.dir.path().to_path_buf();
        let endpoint = self.endpoint;
        let mut starts = Starts::at("kube-apiserver", endpoint);
        let apiserver = loop {
            starts.next().await?;
            let started: Result<_, Error> = async {
                let mut apiserver = spawn_component(
                    &self.assets_dir,
                    "kube-apiserver",
                    &self.apiserver_args,
                    &root,
                    Vec::new(),
                )?;
                match wait_readyz(&self.client, &mut [&mut self.etcd, &mut apiserver]).await {
                    Ok(()) => Ok(apiserver),
                    Err(error) => {
                        stop_process(&mut Some(apiserver), "kube-apiserver", &root)?;
                        Err(error)
                    }
                }
            }
            .await;
            match started {
                Ok(started) => break started,
                Err(error) => starts.retry(error)?,
            }
        };
        self.apiserver = Some(apiserver);
        Ok(())
    }

    /// Whether kube-apiserver runs (it was not stopped, or was started again).
    pub fn apiserver_running(&self) -> bool {
        self.apiserver.is_some()
    }

    /// Stops every process and removes the folder (what dropping it does).
    pub fn stop(self) {
        drop(self);
    }
}

/// The serving certificate's names: the endpoint, loopback, the `kubernetes` Service's address
/// and DNS names, and the caller's extras.
fn serving_names(spec: &WorkloadSpec, ip: IpAddr) -> Vec<String> {
    let mut names = vec![
        ip.to_string(),
        "127.0.0.1".to_owned(),
        "localhost".to_owned(),
        "kubernetes".to_owned(),
        "kubernetes.default".to_owned(),
        "kubernetes.default.svc".to_owned(),
        format!("kubernetes.default.svc.{}", spec.dns_domain),
    ];
    if let Some(ip) = first_service_ip(&spec.service_cidr) {
        names.push(ip.to_string());
    }
    names.extend(spec.extra_sans.iter().cloned());
    names.sort();
    names.dedup();
    names
}

/// The first address of an IPv4 CIDR (the `kubernetes` Service's ClusterIP).
fn first_service_ip(cidr: &str) -> Option<Ipv4Addr> {
    let (addr, bits) = cidr.split_once('/')?;
    let addr: Ipv4Addr = addr.parse().ok()?;
    let bits: u32 = bits.parse().ok()?;
    let mask = u32::MAX.checked_shl(32 - bits.min(32)).unwrap_or(0);
    Some(Ipv4Addr::from((u32::from(addr) & mask) + 1))
}

/// Starts the binary `name` from `assets_dir` for the folder `root`, logging to
/// `<root>/<name>.log`.
fn spawn_component(
    assets_dir: &Path,
    name: &'static str,
    arguments: &[String],
    root: &Path,
    env: Vec<(OsString, OsString)>,
) -> Result<Supervised, Error> {
    start_process(
        name,
        ChildSpec {
            program: assets_dir.join(name),
            args: args(arguments),
            log: root.join(format!("{name}.log")),
            env,
        },
        root,
    )
}

/// Waits until kube-controller-manager has created the `default` ServiceAccount (its service
/// account controller runs) and kwok's `/healthz` answers ok, failing as soon as a process
/// exits.
async fn wait_components(
    client: &Client,
    kwok_port: u16,
    processes: &mut [&mut Supervised],
) -> Result<(), Error> {
    let accounts = Api::<ServiceAccount>::namespaced(client.clone(), "default");
    let deadline = Instant::now() + COMPONENTS_TIMEOUT;
    let (mut controllers_up, mut kwok_up) = (false, false);
    loop {
        for process in processes.iter_mut() {
            process.check_running().map_err(Error::Startup)?;
        }
        if !controllers_up {
            controllers_up = matches!(accounts.get_opt("default").await, Ok(Some(_)));
        }
        if !kwok_up {
            kwok_up = http_ok(kwok_port, "/healthz").await;
        }
        if controllers_up && kwok_up {
            return Ok(());
        }
        if Instant::now() > deadline {
            let mut waiting = Vec::new();
            if !controllers_up {
                waiting.push("kube-controller-manager (no `default` ServiceAccount)");
            }
            if !kwok_up {
                waiting.push("kwok (/healthz)");
            }
            return Err(Error::Startup(format!(
                "not working after {COMPONENTS_TIMEOUT:?}: {}",
                waiting.join(", ")
            )));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Whether `GET http://127.0.0.1:<port><path>` answers 200.
async fn http_ok(port: u16, path: &str) -> bool {
    let address = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    http_get(address, path)
        .await
        .is_some_and(|(status, _)| status == 200)
}

/// What a kubelet registers for its node on first contact: the Node's name, labels, taints,
/// addresses and the system information it reports.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct NodeRegistration {
    /// The Node's name (a kubelet uses its hostname).
    pub name: String,
    /// Labels: the kubelet's own (`kubernetes.io/hostname`, `…/os`, `…/arch`) plus any added.
    pub labels: BTreeMap<String, String>,
    /// Taints registered with the Node (e.g. a control plane's `NoSchedule`).
    pub taints: Vec<Taint>,
    /// The node's `InternalIP`, if any.
    pub internal_ip: Option<IpAddr>,
    /// The kubelet version it reports.
    pub kubelet_version: String,
    /// The OS image it reports (`Talos (vX.Y.Z)` on Talos).
    pub os_image: String,
    /// The machine's SMBIOS UUID, as `status.nodeInfo.systemUUID`.
    pub system_uuid: String,
}

impl NodeRegistration {
    /// A registration for `name` with the labels every kubelet sets.
    pub fn new(name: impl Into<String>) -> Self {
        let name = name.into();
        let labels = [
            ("kubernetes.io/hostname", name.as_str()),
            ("kubernetes.io/os", "linux"),
            ("kubernetes.io/arch", "amd64"),
            ("beta.kubernetes.io/os", "linux"),
            ("beta.kubernetes.io/arch", "amd64"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        Self {
            name,
            labels,
            taints: Vec::new(),
            internal_ip: None,
            kubelet_version: tool_versions().kubernetes,
            os_image: "Talos (simulated)".into(),
            system_uuid: String::new(),
        }
    }

    /// Adds (or replaces) a label.
    pub fn label(mut self, key: impl Into<String>, value: impl Into<String>) -> Self {
        self.labels.insert(key.into(), value.into());
        self
    }

    /// Adds a taint.
    pub fn taint(mut self, taint: Taint) -> Self {
        self.taints.push(taint);
        self
    }

    /// Sets the node's `InternalIP`.
    pub fn internal_ip(mut self, ip: IpAddr) -> Self {
        self.internal_ip = Some(ip);
        self
    }

    /// Sets the OS image the node reports.
    pub fn os_image(mut self, image: impl Into<String>) -> Self {
        self.os_image = image.into();
        self
    }

    /// Sets the SMBIOS UUID the node reports.
    pub fn system_uuid(mut self, uuid: impl Into<String>) -> Self {
        self.system_uuid = uuid.into();
        self
    }

    /// The Node object a kubelet would create (status included, conditions left to kwok).
    pub fn to_node(&self) -> Node {
        let mut addresses = Vec::new();
        if let Some(ip) = self.internal_ip {
            addresses.push(NodeAddress {
                type_: "InternalIP".into(),
                address: ip.to_string(),
            });
        }
        addresses.push(NodeAddress {
            type_: "Hostname".into(),
            address: self.name.clone(),
        });
        Node {
            metadata: ObjectMeta {
                name: Some(self.name.clone()),
                labels: Some(self.labels.clone()),
                annotations: Some(
                    [(
                        "volumes.kubernetes.io/controller-managed-attach-detach".to_owned(),
                        "true".to_owned(),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
            spec: Some(NodeSpec {
                taints: (!self.taints.is_empty()).then(|| self.taints.clone()),
                ..Default::default()
            }),
            status: Some(NodeStatus {
                addresses: Some(addresses),
                node_info: Some(NodeSystemInfo {
                    architecture: self
                        .labels
                        .get("kubernetes.io/arch")
                        .cloned()
                        .unwrap_or_else(|| "amd64".into()),
                    operating_system: "linux".into(),
                    os_image: self.os_image.clone(),
                    kubelet_version: self.kubelet_version.clone(),
                    system_uuid: self.system_uuid.clone(),
                    container_runtime_version: "containerd://simulated".into(),
                    kernel_version: "simulated".into(),
                    ..Default::default()
                }),
                ..Default::default()
            }),
        }
    }
}

/// Creates the Node a kubelet would register (see [`NodeRegistration`]); kwok then makes it
/// Ready.
pub async fn register_node(client: &Client, node: &NodeRegistration) -> Result<Node, Error> {
    Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node.to_node())
        .await
        .map_err(Error::Kube)
}

/// Whether a Node's `Ready` condition is `True`.
pub fn node_is_ready(node: &Node) -> bool {
    node.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// Waits up to `timeout` until the Node `name` exists and is Ready; returns it.
pub async fn wait_node_ready(
    client: &Client,
    name: &str,
    timeout: Duration,
) -> Result<Node, Error> {
    let nodes = Api::<Node>::all(client.clone());
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(Some(node)) = nodes.get_opt(name).await
            && node_is_ready(&node)
        {
            return Ok(node);
        }
        if Instant::now() > deadline {
            return Err(Error::Timeout(format!("node {name} to be Ready")));
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn first_service_ip_is_network_plus_one() {
        assert_eq!(
            first_service_ip("10.96.0.0/12"),
            Some(Ipv4Addr::new(10, 96, 0, 1))
        );
        assert_eq!(
            first_service_ip("10.0.0.7/24"),
            Some(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(first_service_ip("fd00::/108"), None);
    }

    #[test]
    fn registration_carries_kubelet_labels_and_addresses() {
        let node = NodeRegistration::new("cp-1")
            .label("node-role.kubernetes.io/control-plane", "")
            .internal_ip("127.0.31.2".parse().expect("ip"))
            .to_node();
        let labels = node.metadata.labels.expect("labels");
        assert_eq!(labels["kubernetes.io/hostname"], "cp-1");
        assert_eq!(labels["node-role.kubernetes.io/control-plane"], "");
        let addresses = node.status.and_then(|s| s.addresses).expect("addresses");
        assert_eq!(addresses[0].type_, "InternalIP");
        assert_eq!(addresses[0].address, "127.0.31.2");
    }
}
