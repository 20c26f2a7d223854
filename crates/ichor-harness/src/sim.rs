//! The sim target: a private kube-apiserver and etcd, simulated Talos nodes on
//! `127.0.<net>.1..=n:50000`, and the real `ichor-webhook` and `ichor-manager` binaries.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use ichor_api::admission;
use ichor_sim::{Hardware, NodeSpec, SimFactory, SimNode, Timings};
use ichor_testenv::{CertAndKey, NodeRegistration, TestEnv, WorkloadControlPlane, WorkloadSpec};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use kube::api::{Api, ObjectMeta, PostParams};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::{Child, Command};
use tokio::task::JoinHandle;

use crate::front::Front;
use crate::kubelets::KubeletVersions;
use crate::replica::{Launch, Replica};
use crate::{Capabilities, Error, Target, binary};

/// The namespace the binaries run "in" (their Lease and the webhook's CA Secret).
pub const SYSTEM_NAMESPACE: &str = admission::SYSTEM_NAMESPACE;

/// How the sim target is shaped.
#[derive(Debug, Clone)]
pub struct SimOptions {
    /// How many nodes.
    pub nodes: u8,
    /// The third octet of the nodes' loopback addresses (`127.0.<net>.x`).
    pub net: u8,
    /// The Talos version the nodes run.
    pub talos_version: String,
    /// The nodes' timings.
    pub timings: Timings,
    /// About how large the etcd database of the nodes' cluster is, in bytes
    /// ([`NodeSpec::etcd_size`]; [`ichor_sim::DEFAULT_ETCD_SIZE`] unless a spec says).
    pub etcd_size: u64,
    /// Create the webhook's certificate Secret empty before the webhook starts, as the Helm
    /// chart does (the webhook fills it); otherwise the webhook creates it.
    pub empty_cert_secret: bool,
    /// More arguments for the manager (e.g. `--credential-lifetime 45s`).
    pub manager_args: Vec<String>,
    /// The manager's install stall limit in seconds (`--install-stall-seconds`); its default
    /// (sized for real hardware) unless a spec says.
    pub install_stall_seconds: Option<u64>,
    /// Changes node `host`'s hardware from [`Hardware::vm`]'s (e.g. more disks); none when
    /// absent.
    pub hardware: Option<fn(u8, &mut Hardware)>,
    /// The BMC of node `host` (`ichor_sim::NodeSpec::bmc`): none when absent, or when it
    /// gives none for that host.
    pub bmc: Option<fn(u8) -> Option<ichor_sim::BmcSpec>>,
    /// More nodes, after the `nodes` on `net`: one at each of these addresses (port 50000),
    /// for a fleet that spans several /24s.
    pub more_addresses: Vec<std::net::Ipv4Addr>,
    /// How often the manager retries an unfinished reconcile, in milliseconds
    /// (`--requeue-ms`): short unless a spec measures the shipped default.
    pub requeue_ms: u64,
    /// How long the manager's discovery sweep waits for each address, in milliseconds
    /// (`--sweep-timeout-ms`).
    pub sweep_timeout_ms: u64,
    /// How long the manager's Lease lasts (`--lease-seconds`): short, so that a restarted
    /// manager takes over quickly after a kill; a replica that loses it is started again
    /// (ADR 0044). A spec whose fault must not cost the leader its Lease passes a longer one.
    pub lease_seconds: u64,
    /// The runtime the simulated nodes run on: the caller's unless set. A fleet of hundreds of
    /// nodes gets its own threads, so that the nodes and the spec's own client do not starve
    /// each other on one runtime.
    pub nodes_runtime: Option<tokio::runtime::Handle>,
}

impl SimOptions {
    /// `nodes` nodes on `127.0.<net>.x` running `talos_version`.
    pub fn new(nodes: u8, net: u8, talos_version: &str) -> Self {
        Self {
            nodes,
            net,
            talos_version: talos_version.to_owned(),
            timings: Timings::default(),
            etcd_size: ichor_sim::DEFAULT_ETCD_SIZE,
            empty_cert_secret: false,
            manager_args: Vec::new(),
            install_stall_seconds: None,
            hardware: None,
            bmc: None,
            more_addresses: Vec::new(),
            requeue_ms: 300,
            sweep_timeout_ms: 500,
            lease_seconds: 5,
            nodes_runtime: None,
        }
    }

    /// Every node's address and the seed of its hardware: the `nodes` on `net`, then
    /// `more_addresses`.
    fn node_addresses(&self) -> Vec<(std::net::Ipv4Addr, u8)> {
        (1..=self.nodes)
            .map(|host| (std::net::Ipv4Addr::new(127, 0, self.net, host), host))
            .chain(self.more_addresses.iter().map(|ip| (*ip, ip.octets()[3])))
            .collect()
    }
}

/// The running sim target.
pub struct SimTarget {
    env: TestEnv,
    namespace: String,
    nodes: Vec<SimNode>,
    /// The Image Factory the nodes pull factory installers from.
    factory: SimFactory,
    manager: Option<Replica>,
    manager_runs: u32,
    manager_log: LogTail,
    /// The second manager replica, when a spec started one.
    second: Option<Replica>,
    second_runs: u32,
    /// How many times a replica lost its Lease, exited, and was started again.
    lease_restarts: Arc<AtomicU32>,
    webhook: Option<Child>,
    /// The port the webhook serves admission reviews on (127.0.0.1).
    webhook_port: u16,
    /// The binaries' way to the apiserver, closed while it restarts.
    front: Front,
    dir: tempfile::TempDir,
    manager_kubeconfig: PathBuf,
    options: SimOptions,
    workload: tokio::sync::Mutex<Option<WorkloadControlPlane>>,
    /// The follower of the kubelets' versions into their Nodes, from the workload control
    /// plane's start on.
    kubelet_versions: std::sync::Mutex<Option<KubeletVersions>>,
}

impl std::fmt::Debug for SimTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimTarget")
            .field("namespace", &self.namespace)
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

fn user(name: &str) -> String {
    format!("system:serviceaccount:{SYSTEM_NAMESPACE}:{name}")
}

/// Binds `name`'s ClusterRole and Role (as shipped) to its ServiceAccount user.
async fn bind(
    client: &kube::Client,
    name: &str,
    cluster_role: ClusterRole,
    role: Role,
) -> Result<(), Error> {
    let subject = Subject {
        kind: "User".into(),
        name: user(name),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    };
    bind_subject(client, SYSTEM_NAMESPACE, name, cluster_role, role, subject).await
}

/// Creates `name`'s ClusterRole and Role (in `namespace`) as shipped, binds both to
/// `subject`, and waits until the authorizer grants them ([`wait_granted`]).
pub(crate) async fn bind_subject(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    cluster_role: ClusterRole,
    role: Role,
    subject: Subject,
) -> Result<(), Error> {
    // The user name the apiserver authenticates the subject as.
    let user = match (subject.kind.as_str(), &subject.namespace) {
        ("ServiceAccount", Some(namespace)) => {
            format!("system:serviceaccount:{namespace}:{}", subject.name)
        }
        _ => subject.name.clone(),
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: name.into(),
    };
    Api::<ClusterRole>::all(client.clone())
        .create(&PostParams::default(), &cluster_role)
        .await?;
    Api::<ClusterRoleBinding>::all(client.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                role_ref: role_ref("ClusterRole"),
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await?;
    Api::<Role>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &role)
        .await?;
    Api::<RoleBinding>::namespaced(client.clone(), namespace)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                role_ref: role_ref("Role"),
                subjects: Some(vec![subject]),
            },
        )
        .await?;
    wait_granted(client, &user, &cluster_role, &role).await
}

/// The shipped identities: each binary's name, ClusterRole and Role (in [`SYSTEM_NAMESPACE`]).
fn shipped_roles() -> [(&'static str, ClusterRole, Role); 2] {
    [
        (
            admission::WEBHOOK_NAME,
            admission::webhook_cluster_role(),
            admission::webhook_role(SYSTEM_NAMESPACE),
        ),
        (
            admission::MANAGER_NAME,
            admission::manager_cluster_role(),
            admission::manager_role(SYSTEM_NAMESPACE),
        ),
    ]
}

/// Waits until the apiserver's authorizer grants `user` what `cluster_role` (cluster-wide) and
/// `role` (in its namespace) say. The authorizer reads Roles and bindings from informers: a
/// binding just created, or every one after the apiserver (re)started, counts only once its
/// informer has it, and until then a request the roles grant is refused. `/readyz` says
/// when the informers first listed what was stored, not when they caught up with a binding
/// made since; a SubjectAccessReview asks the authorizer itself. One review per rule (its
/// first group, resource, verb and name) covers every Role and binding object.
pub(crate) async fn wait_granted(
    client: &kube::Client,
    user: &str,
    cluster_role: &ClusterRole,
    role: &Role,
) -> Result<(), Error> {
    use k8s_openapi::api::authorization::v1::{
        ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
    };
    let first = |list: &Option<Vec<String>>| list.as_ref().and_then(|l| l.first()).cloned();
    let rules = |rules: &Option<Vec<k8s_openapi::api::rbac::v1::PolicyRule>>,
                 namespace: Option<String>| {
        rules
            .iter()
            .flatten()
            .filter_map(|rule| {
                let resource = first(&rule.resources)?;
                let (resource, subresource) = match resource.split_once('/') {
                    Some((resource, sub)) => (resource.to_owned(), Some(sub.to_owned())),
                    None => (resource, None),
                };
                Some(ResourceAttributes {
                    group: first(&rule.api_groups),
                    resource: Some(resource),
                    subresource,
                    verb: rule.verbs.first().cloned(),
                    name: first(&rule.resource_names),
                    namespace: namespace.clone(),
                    ..Default::default()
                })
            })
            .collect::<Vec<_>>()
    };
    let mut asks = rules(&cluster_role.rules, None);
    asks.extend(rules(&role.rules, role.metadata.namespace.clone()));
    let reviews = Api::<SubjectAccessReview>::all(client.clone());
    ichor_testenv::wait::try_eventually(
        &format!("the authorizer to grant {user} its roles"),
        Duration::from_secs(60),
        || async {
            for ask in &asks {
                let review = SubjectAccessReview {
                    spec: SubjectAccessReviewSpec {
                        user: Some(user.to_owned()),
                        resource_attributes: Some(ask.clone()),
                        ..Default::default()
                    },
                    ..Default::default()
                };
                let answer = reviews
                    .create(&PostParams::default(), &review)
                    .await
                    .map_err(|e| format!("a SubjectAccessReview: {e}"))?;
                if !answer.status.is_some_and(|s| s.allowed) {
                    return Err(format!("not yet allowed: {ask:?}"));
                }
            }
            Ok(())
        },
    )
    .await?;
    Ok(())
}

/// Starts a binary and waits for its first line starting with `ready_prefix`; returns the
/// process and that line.
/// The last lines a process printed (its logs), for failure messages.
pub type LogTail = Arc<std::sync::Mutex<std::collections::VecDeque<String>>>;

/// How many lines of a process's log are kept.
pub(crate) const LOG_LINES: usize = 300;

/// The file in the target's folder holding the manager's whole log (every run).
const MANAGER_LOG: &str = "manager.log";
/// The file in the target's folder holding the second manager replica's whole log (every run).
const SECOND_MANAGER_LOG: &str = "manager-b.log";
/// The manager's leader-election Lease in [`SYSTEM_NAMESPACE`] (its `--lease-name` default).
pub const MANAGER_LEASE: &str = "ichor-manager";
/// The file in the target's folder holding the webhook's whole log.
const WEBHOOK_LOG: &str = "webhook.log";

pub(crate) async fn spawn(
    path: PathBuf,
    args: &[String],
    kubeconfig: &PathBuf,
    ready_prefix: &str,
    log: Option<LogTail>,
    log_file: Option<&std::path::Path>,
) -> Result<(Child, String), Error> {
    let (child, line, _) =
        spawn_drained(path, args, kubeconfig, ready_prefix, log, log_file).await?;
    Ok((child, line))
}

/// What the manager prints when it stops because it lost its Lease (its `Failure::LostLease`).
const LOST_LEASE: &str = "lost the lease";

/// Like [`spawn`], and also returns the task draining the process's stdout, which ends when
/// the process closed it and says whether a line reported a lost Lease ([`LOST_LEASE`]).
pub(crate) async fn spawn_drained(
    path: PathBuf,
    args: &[String],
    kubeconfig: &PathBuf,
    ready_prefix: &str,
    log: Option<LogTail>,
    log_file: Option<&std::path::Path>,
) -> Result<(Child, String, JoinHandle<bool>), Error> {
    // Every line also goes to `log_file`, whole: what the secret scan reads.
    let mut file = match log_file {
        Some(path) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(path)?,
        ),
        None => None,
    };
    let mut keep = move |line: &str| {
        use std::io::Write as _;
        if let Some(file) = file.as_mut() {
            let _ = writeln!(file, "{line}");
        }
    };
    let mut child = Command::new(&path)
        .env_clear()
        .envs(
            crate::rails::child_env(std::env::vars_os())
                .map_err(|e| Error::Binary(e.to_string()))?,
        )
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env(
            "RUST_LOG",
            std::env::var("ICHOR_E2E_LOG").unwrap_or_else(|_| "warn,ichor_manager=info".into()),
        )
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| Error::Binary(format!("cannot start {}: {e}", path.display())))?;
    let mut lines = BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    let line = tokio::time::timeout(Duration::from_secs(60), async {
        while let Some(line) = lines.next_line().await? {
            keep(&line);
            if line.starts_with(ready_prefix) {
                return Ok::<_, std::io::Error>(Some(line));
            }
        }
        Ok(None)
    })
    .await
    .map_err(|_| Error::Binary(format!("{} did not start within 60 s", path.display())))??
    .ok_or_else(|| Error::Binary(format!("{} exited before it was ready", path.display())))?;
    // Keep draining its stdout so it never blocks on a full pipe.
    let drained = tokio::spawn(async move {
        let mut lost_lease = false;
        while let Ok(Some(line)) = lines.next_line().await {
            keep(&line);
            lost_lease |= line.contains(LOST_LEASE);
            if let Some(log) = &log
                && let Ok(mut log) = log.lock()
            {
                if log.len() == LOG_LINES {
                    log.pop_front();
                }
                log.push_back(line);
            }
        }
        lost_lease
    });
    Ok((child, line, drained))
}

/// Waits until the apiserver calls the webhook and gets its answer: the configuration it
/// admits with holds the caBundle the webhook injected. Until its informer has the injected
/// configuration, the apiserver either does not call the webhook (a delete it should refuse
/// goes through) or fails the TLS handshake (`failurePolicy: Fail` refuses everything it
/// guards). The probe is a dry-run TalosOperation the webhook admits (a snapshot: nothing to
/// check); a call that went through shows in the apiserver's
/// `apiserver_admission_webhook_request_total` with code 200.
async fn webhook_answering(admin: &kube::Client, namespace: &str) -> Result<(), Error> {
    use ichor_api::TalosOperation;
    use ichor_api::operation::OperationAction;
    let operations = Api::<TalosOperation>::namespaced(admin.clone(), namespace);
    let probe = TalosOperation::test("webhook-probe", OperationAction::EtcdSnapshot)
        .cluster("webhook-probe")
        .all()
        .build();
    let dry_run = PostParams {
        dry_run: true,
        ..PostParams::default()
    };
    // The webhook's name in its configuration, as the apiserver's metrics label its calls.
    let hook = admission::validating_webhook_configuration()
        .webhooks
        .unwrap_or_default()
        .first()
        .map(|w| format!("name=\"{}\"", w.name))
        .unwrap_or_default();
    ichor_testenv::wait::try_eventually(
        "the apiserver to call the webhook with its injected CA",
        Duration::from_secs(60),
        || async {
            if let Err(error) = operations.create(&dry_run, &probe).await {
                return Err(format!("the dry-run probe: {error}"));
            }
            let request = http::Request::get("/metrics")
                .body(Vec::new())
                .map_err(|e| e.to_string())?;
            let metrics = admin
                .request_text(request)
                .await
                .map_err(|e| format!("the apiserver's metrics: {e}"))?;
            let answered = metrics.lines().any(|line| {
                line.starts_with("apiserver_admission_webhook_request_total{")
                    && line.contains(hook.as_str())
                    && line.contains("code=\"200\"")
                    && !line.ends_with(" 0")
            });
            if answered {
                Ok(())
            } else {
                Err("admitted without a call to the webhook".to_owned())
            }
        },
    )
    .await?;
    Ok(())
}

impl SimTarget {
    /// Brings the target up: control plane, CRDs, RBAC, webhook, nodes, manager.
    pub async fn up(options: SimOptions) -> Result<Self, Error> {
        let env = TestEnv::private().await?;
        env.install_crds(ichor_api::crds()).await?;
        let admin = env.client();
        Api::<Namespace>::all(admin.clone())
            .create(
                &PostParams::default(),
                &Namespace {
                    metadata: ObjectMeta {
                        name: Some(SYSTEM_NAMESPACE.into()),
                        ..Default::default()
                    },
                    ..Default::default()
                },
            )
            .await?;
        let namespace = env.namespace("e2e").await?;
        for (name, cluster_role, role) in shipped_roles() {
            bind(&admin, name, cluster_role, role).await?;
        }
        // The binaries reach the apiserver through the front, which a restart closes.
        let server = env.connection().server().to_owned();
        let upstream = server
            .strip_prefix("https://")
            .and_then(|addr| addr.parse().ok())
            .ok_or_else(|| Error::Spec(format!("the apiserver's URL {server} is no address")))?;
        let front = Front::start(upstream).await?;
        let dir = tempfile::tempdir()?;
        let through_front = |name: &str| -> Result<String, Error> {
            Ok(env.connection().kubeconfig_for(&user(name), None)?.replace(
                &format!("server: {server}\n"),
                &format!("server: {}\n", front.url()),
            ))
        };
        let webhook_kubeconfig = dir.path().join("webhook.kubeconfig");
        std::fs::write(&webhook_kubeconfig, through_front(admission::WEBHOOK_NAME)?)?;
        let manager_kubeconfig = dir.path().join("manager.kubeconfig");
        std::fs::write(&manager_kubeconfig, through_front(admission::MANAGER_NAME)?)?;

        if options.empty_cert_secret {
            Api::<k8s_openapi::api::core::v1::Secret>::namespaced(admin.clone(), SYSTEM_NAMESPACE)
                .create(
                    &PostParams::default(),
                    &k8s_openapi::api::core::v1::Secret {
                        metadata: ObjectMeta {
                            name: Some(admission::WEBHOOK_CERT_SECRET.into()),
                            ..Default::default()
                        },
                        type_: Some("Opaque".into()),
                        ..Default::default()
                    },
                )
                .await?;
        }
        // The webhook, registered with the shipped configuration (pointed at its address),
        // answering only the apiserver: the client certificate the apiserver presents to
        // webhooks is the only one it accepts (ADR 0051).
        let client_ca = env.connection().webhook_client_ca_file();
        let (webhook, line) = spawn(
            binary("ichor-webhook")?,
            &[
                "--namespace".into(),
                SYSTEM_NAMESPACE.into(),
                "--pod-ip".into(),
                "127.0.0.1".into(),
                "--port".into(),
                "0".into(),
                "--refresh-seconds".into(),
                "1".into(),
                "--client-ca-file".into(),
                client_ca.display().to_string(),
            ],
            &webhook_kubeconfig,
            "listening on",
            None,
            Some(&dir.path().join(WEBHOOK_LOG)),
        )
        .await?;
        let webhook_port: u16 = line
            .rsplit(':')
            .next()
            .and_then(|p| p.trim().parse().ok())
            .ok_or_else(|| {
                Error::Spec(format!("the webhook's first line names no port: {line}"))
            })?;
        crate::cluster_target::register_webhook(
            &admin,
            &format!(
                "https://127.0.0.1:{webhook_port}{}",
                admission::WEBHOOK_PATH
            ),
        )
        .await?;
        webhook_answering(&admin, &namespace).await?;

        // One Image Factory for every node, as a real fleet pulls from one (its schematic API
        // is what `spec.imageFactory.url` may name).
        let factory = SimFactory::start(([127, 0, 0, 1], 0).into()).await?;
        let mut nodes = Vec::new();
        for (ip, host) in options.node_addresses() {
            let addr = std::net::SocketAddr::from((ip, 50000));
            let [_, _, net, _] = ip.octets();
            let mut hardware = Hardware::vm(u32::from(net) * 256 + u32::from(host));
            if let Some(change) = options.hardware {
                change(host, &mut hardware);
            }
            let spec = NodeSpec {
                hardware,
                timings: options.timings,
                etcd_size: options.etcd_size,
                factory: factory.clone(),
                bmc: options.bmc.and_then(|bmc| bmc(host)),
                ..NodeSpec::new(addr, &options.talos_version)
            };
            let node = match &options.nodes_runtime {
                Some(runtime) => runtime
                    .spawn(SimNode::spawn(spec))
                    .await
                    .map_err(|e| Error::Spec(format!("a simulated node did not start: {e}")))??,
                None => SimNode::spawn(spec).await?,
            };
            nodes.push(node);
        }
        let mut target = Self {
            env,
            namespace,
            nodes,
            factory,
            manager: None,
            manager_runs: 0,
            manager_log: LogTail::default(),
            second: None,
            second_runs: 0,
            lease_restarts: Arc::default(),
            webhook: Some(webhook),
            webhook_port,
            front,
            dir,
            manager_kubeconfig,
            options,
            workload: tokio::sync::Mutex::new(None),
            kubelet_versions: std::sync::Mutex::new(None),
        };
        target.start_manager().await?;
        Ok(target)
    }

    /// The manager's arguments for a replica named `identity`.
    fn manager_args(&self, identity: &str) -> Vec<String> {
        let mut args: Vec<String> = vec![
            "--namespace".into(),
            SYSTEM_NAMESPACE.into(),
            "--identity".into(),
            identity.to_owned(),
            "--metrics-addr".into(),
            "127.0.0.1:0".into(),
            // Short, so that a manager started after a kill takes over quickly. A replica that
            // loses it on a loaded machine exits and is started again, as its Deployment
            // would start it (ADR 0044).
            "--lease-seconds".into(),
            self.options.lease_seconds.to_string(),
            "--sweep-timeout-ms".into(),
            self.options.sweep_timeout_ms.to_string(),
            "--requeue-ms".into(),
            self.options.requeue_ms.to_string(),
        ];
        args.extend(self.options.manager_args.iter().cloned());
        if let Some(stall) = self.options.install_stall_seconds {
            args.extend(["--install-stall-seconds".to_owned(), stall.to_string()]);
        }
        args
    }

    /// Starts a replica named `identity` logging to `log_file`, supervised as its Deployment
    /// would run it ([`Replica`]).
    async fn start_replica(&self, identity: &str, log_file: &str) -> Result<Replica, Error> {
        let launch = Launch {
            binary: binary("ichor-manager")?,
            args: self.manager_args(identity),
            kubeconfig: self.manager_kubeconfig.clone(),
            log: Arc::clone(&self.manager_log),
            log_file: self.dir.path().join(log_file),
        };
        Replica::start(identity, launch, Arc::clone(&self.lease_restarts)).await
    }

    /// Starts (or restarts) the manager process, as a new pod (`manager-<run>`): a replica
    /// that loses its Lease is started again under its identity, as its Deployment would.
    pub async fn start_manager(&mut self) -> Result<(), Error> {
        self.manager_runs += 1;
        let identity = format!("manager-{}", self.manager_runs);
        self.manager = Some(self.start_replica(&identity, MANAGER_LOG).await?);
        Ok(())
    }

    /// Starts (or restarts) a second manager replica beside the first, with an identity of its
    /// own (`replica-b-<run>`) and its own log file (which the secret scan reads too). It stands
    /// by until the Lease is free, as a second pod of the Deployment does.
    pub async fn start_second_manager(&mut self) -> Result<(), Error> {
        self.second_runs += 1;
        let identity = format!("replica-b-{}", self.second_runs);
        self.second = Some(self.start_replica(&identity, SECOND_MANAGER_LOG).await?);
        Ok(())
    }

    /// The identities of the manager replicas running now (the first, then the second).
    pub fn manager_identities(&self) -> Vec<String> {
        self.manager
            .iter()
            .chain(self.second.iter())
            .map(|replica| replica.identity().to_owned())
            .collect()
    }

    /// The manager's leader-election Lease as it stands ([`MANAGER_LEASE`]); none before a
    /// replica first took it.
    pub async fn manager_lease(
        &self,
    ) -> Result<Option<k8s_openapi::api::coordination::v1::LeaseSpec>, Error> {
        let leases = Api::<k8s_openapi::api::coordination::v1::Lease>::namespaced(
            self.env.client(),
            SYSTEM_NAMESPACE,
        );
        Ok(leases
            .get_opt(MANAGER_LEASE)
            .await?
            .and_then(|lease| lease.spec))
    }

    /// Which replica holds the manager's Lease (its `holderIdentity`).
    pub async fn lease_holder(&self) -> Result<Option<String>, Error> {
        Ok(self
            .manager_lease()
            .await?
            .and_then(|spec| spec.holder_identity))
    }

    /// Kills the replica holding the manager's Lease with SIGKILL, as a crash would; returns
    /// its identity. Fails when the holder is none of the running replicas.
    pub async fn kill_leader(&mut self) -> Result<String, Error> {
        let holder = self
            .lease_holder()
            .await?
            .ok_or_else(|| Error::Spec("no replica holds the manager's Lease".into()))?;
        if self
            .manager
            .as_ref()
            .is_some_and(|r| r.identity() == holder)
        {
            self.kill_manager().await;
        } else if self.second.as_ref().is_some_and(|r| r.identity() == holder) {
            self.kill_second_manager().await;
        } else {
            return Err(Error::Spec(format!(
                "the Lease holder {holder} is not a running replica ({:?})",
                self.manager_identities()
            )));
        }
        Ok(holder)
    }

    /// Kills the second manager replica with SIGKILL.
    pub async fn kill_second_manager(&mut self) {
        if let Some(replica) = self.second.take() {
            replica.kill().await;
        }
    }

    /// The running manager's `/metrics`, as Prometheus text.
    pub async fn manager_metrics(&self) -> Result<String, Error> {
        self.manager_get("/metrics").await
    }

    /// The running manager's `/healthz`: its HTTP status code and body.
    pub async fn manager_health(&self) -> Result<(u16, String), Error> {
        let text = self.manager_get("/healthz").await?;
        let code = text
            .split_whitespace()
            .nth(1)
            .and_then(|code| code.parse().ok())
            .unwrap_or_default();
        let body = text
            .split_once("\r\n\r\n")
            .map(|(_, body)| body.to_owned())
            .unwrap_or_default();
        Ok((code, body))
    }

    /// The running manager's answer to `GET path` on its metrics address, headers and all.
    async fn manager_get(&self, path: &str) -> Result<String, Error> {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let addr = self
            .manager
            .as_ref()
            .and_then(Replica::metrics)
            .ok_or_else(|| Error::Spec("the manager is not running".into()))?;
        let mut stream = tokio::net::TcpStream::connect(addr).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.1\r\nhost: metrics\r\nconnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut text = String::new();
        stream.read_to_string(&mut text).await?;
        Ok(text)
    }

    /// How many reconciles of `kind` (e.g. `TalosMachine`) the running manager has counted,
    /// read from its `/metrics`: a test's proof that the manager had its chance to act before
    /// it asserts that something did not happen.
    pub async fn manager_reconciles(&self, kind: &str) -> Result<u64, Error> {
        self.manager_counter("ichor_reconciles_total", kind).await
    }

    /// The running manager's counter `series` for `kind` (0 when it has no such line yet).
    async fn manager_counter(&self, series: &str, kind: &str) -> Result<u64, Error> {
        let text = self.manager_metrics().await?;
        let series = format!("{series}{{kind=\"{kind}\"}}");
        Ok(text
            .lines()
            .find_map(|line| line.strip_prefix(series.as_str()))
            .and_then(|value| value.trim().parse::<f64>().ok())
            .map_or(0, |value| value as u64))
    }

    /// A client of the management cluster as `user` in `group` (e.g. `system:masters`): its
    /// requests are audited under its own name, unlike the test administrator's.
    pub async fn client_as(&self, user: &str, group: Option<&str>) -> Result<kube::Client, Error> {
        Ok(self.env.client_as(user, group).await?)
    }

    /// The running manager's reconciles of `kind` that were skipped as echoes of the object's
    /// own last look (`ichor_reconciles_skipped_total`).
    pub async fn manager_skipped(&self, kind: &str) -> Result<u64, Error> {
        self.manager_counter("ichor_reconciles_skipped_total", kind)
            .await
    }

    /// The running manager's process id (for reading its `/proc` figures).
    pub fn manager_pid(&self) -> Option<u32> {
        self.manager.as_ref().and_then(Replica::pid)
    }

    /// How many times a manager replica lost its Lease, exited, and was started again
    /// (`Replica`); each restart is also a line in the manager's log.
    pub fn manager_lease_restarts(&self) -> u32 {
        self.lease_restarts.load(Ordering::SeqCst)
    }

    /// The manager's last log lines (every run), for failure messages.
    pub fn manager_log_tail(&self) -> String {
        self.manager_log
            .lock()
            .map(|l| l.iter().cloned().collect::<Vec<_>>().join("\n"))
            .unwrap_or_default()
    }

    /// Kills the manager with SIGKILL, as a crash would.
    pub async fn kill_manager(&mut self) {
        if let Some(replica) = self.manager.take() {
            replica.kill().await;
        }
    }

    /// Stops the workload cluster's apiserver (started by `kubelets_registered`): its API stops
    /// answering, and everything it stored stays for [`start_workload_api`](Self::start_workload_api).
    pub async fn stop_workload_api(&self) -> Result<(), Error> {
        let mut workload = self.workload.lock().await;
        let plane = workload
            .as_mut()
            .ok_or_else(|| Error::Spec("no workload control plane runs".into()))?;
        plane.stop_apiserver()?;
        Ok(())
    }

    /// Starts the workload cluster's apiserver again, same endpoint and certificates, and waits
    /// until it is ready.
    pub async fn start_workload_api(&self) -> Result<(), Error> {
        let mut workload = self.workload.lock().await;
        let plane = workload
            .as_mut()
            .ok_or_else(|| Error::Spec("no workload control plane runs".into()))?;
        plane.start_apiserver().await?;
        Ok(())
    }

    /// The management cluster's control plane (the target's own).
    fn management(&mut self) -> &mut ichor_testenv::ControlPlane {
        self.env
            .private_mut()
            .expect("the sim target starts a control plane of its own")
    }

    /// Stops the management cluster's etcd (SIGKILL); its data stays for
    /// [`start_management_etcd`](Self::start_management_etcd).
    pub fn stop_management_etcd(&mut self) -> Result<(), Error> {
        Ok(self.management().stop_etcd()?)
    }

    /// Starts the management cluster's etcd again, same ports and data, and waits until the
    /// apiserver is ready.
    pub async fn start_management_etcd(&mut self) -> Result<(), Error> {
        Ok(self.management().start_etcd().await?)
    }

    /// Stops the management cluster's kube-apiserver (SIGKILL): nothing answers on its port
    /// until [`start_management_api`](Self::start_management_api), and the binaries' way to it
    /// (`Front`) closes.
    pub fn stop_management_api(&mut self) -> Result<(), Error> {
        self.front.close();
        Ok(self.management().stop_apiserver()?)
    }

    /// Starts the management cluster's kube-apiserver again, same port, certificates and etcd,
    /// and waits until it is ready and its authorizer has read the shipped roles; only then do
    /// the binaries reach it again.
    pub async fn start_management_api(&mut self) -> Result<(), Error> {
        self.management().start_apiserver().await?;
        let admin = self.env.client();
        for (name, cluster_role, role) in shipped_roles() {
            wait_granted(&admin, &user(name), &cluster_role, &role).await?;
        }
        self.front.open();
        Ok(())
    }

    /// The webhook's admission address (`https://127.0.0.1:PORT/validate`): for a spec that
    /// calls it as someone other than the apiserver.
    pub fn webhook_url(&self) -> String {
        format!(
            "https://127.0.0.1:{}{}",
            self.webhook_port,
            admission::WEBHOOK_PATH
        )
    }

    /// The simulated nodes.
    pub fn nodes(&self) -> &[SimNode] {
        &self.nodes
    }

    /// The simulated Image Factory every node pulls factory installers from, serving the
    /// schematic API at [`SimFactory::url`].
    pub fn factory(&self) -> &SimFactory {
        &self.factory
    }

    /// The options it was brought up with.
    pub fn options(&self) -> &SimOptions {
        &self.options
    }

    /// The folder holding its files.
    pub fn dir(&self) -> &std::path::Path {
        self.dir.path()
    }

    /// Fails when a secret value of the run shows in a manager replica's or the webhook's log, an
    /// Event, or an Ichor object's status ([`crate::leaks`]).
    pub async fn check_no_leaks(&self) -> Result<(), Error> {
        let manager = self.dir.path().join(MANAGER_LOG);
        let second = self.dir.path().join(SECOND_MANAGER_LOG);
        let webhook = self.dir.path().join(WEBHOOK_LOG);
        let mut logs: Vec<(&str, &std::path::Path)> =
            vec![("manager", &manager), ("webhook", &webhook)];
        if second.exists() {
            logs.push(("second manager", &second));
        }
        crate::leaks::check_cluster(&self.env.client(), &logs).await
    }

    /// Tears everything down, after the secret scan ([`Self::check_no_leaks`]): a leak fails
    /// the spec that brought the target up.
    pub async fn down(mut self) {
        let scanned = self.check_no_leaks().await;
        if let Ok(mut follower) = self.kubelet_versions.lock() {
            follower.take();
        }
        if let Some(workload) = self.workload.lock().await.take() {
            workload.stop();
        }
        self.kill_manager().await;
        self.kill_second_manager().await;
        if let Some(mut webhook) = self.webhook.take() {
            let _ = webhook.kill().await;
        }
        for node in self.nodes.drain(..) {
            node.stop().await;
        }
        if let Err(leaked) = scanned {
            panic!("{leaked}");
        }
    }
}

impl Target for SimTarget {
    fn kubeconfig(&self) -> &str {
        self.env.connection().kubeconfig()
    }

    fn context(&self) -> &str {
        "ichor-testenv"
    }

    fn node_endpoints(&self) -> Vec<String> {
        self.nodes
            .iter()
            .map(|n| n.addr().ip().to_string())
            .collect()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            faults: true,
            kill_points: true,
        }
    }

    fn namespace(&self) -> &str {
        &self.namespace
    }

    fn client(&self) -> kube::Client {
        self.env.client()
    }

    async fn kubelets_registered(&self, cluster: &str) -> Result<(), Error> {
        use ichor_api::{TalosCluster, TalosMachine};
        use kube::ResourceExt as _;
        let admin = self.env.client();
        let found = Api::<TalosCluster>::namespaced(admin.clone(), &self.namespace)
            .get(cluster)
            .await?;
        let mut workload = self.workload.lock().await;
        if workload.is_none() {
            let secret = found
                .status
                .as_ref()
                .and_then(|s| s.core.secrets_secret.clone())
                .ok_or_else(|| Error::Spec("the cluster has no secrets bundle yet".into()))?;
            let bundle_yaml = Api::<k8s_openapi::api::core::v1::Secret>::namespaced(
                admin.clone(),
                &self.namespace,
            )
            .get(&secret)
            .await?
            .data
            .and_then(|d| {
                d.get("secrets.yaml")
                    .map(|b| String::from_utf8_lossy(&b.0).into_owned())
            })
            .ok_or_else(|| Error::Spec("the bundle Secret has no secrets.yaml".into()))?;
            let bundle = ichor_render::SecretsBundle::from_yaml(&bundle_yaml)
                .map_err(|e| Error::Spec(format!("bundle: {e}")))?;
            let url = found
                .spec
                .endpoint
                .trim_start_matches("https://")
                .to_owned();
            let endpoint: std::net::SocketAddr = url.parse().map_err(|_| {
                Error::Spec(format!(
                    "the sim target needs an IP:port endpoint, not {url}"
                ))
            })?;
            let ca = CertAndKey {
                cert_pem: bundle.certs.k8s.crt.0.clone(),
                key_pem: bundle.certs.k8s.key.0.clone(),
            };
            let plane =
                WorkloadControlPlane::start(WorkloadSpec::new(endpoint, ca).cluster_name(cluster))
                    .await?;
            // From now on each Node reports its kubelet's version, as a kubelet restarted with
            // a new image does.
            if let Ok(mut follower) = self.kubelet_versions.lock() {
                *follower = Some(KubeletVersions::follow(plane.client(), self.nodes.clone()));
            }
            *workload = Some(plane);
        }
        let plane = workload.as_ref().expect("started above");
        let machines = Api::<TalosMachine>::namespaced(admin, &self.namespace)
            .list(&Default::default())
            .await?;
        for machine in machines
            .items
            .iter()
            .filter(|m| m.spec.cluster_ref.name == cluster)
        {
            let Some(status) = &machine.status else {
                continue;
            };
            let (Some(name), Some(address)) =
                (&status.lifecycle.node_name, &status.inventory.address)
            else {
                continue;
            };
            let mut registration = NodeRegistration::new(name.clone());
            if let Ok(ip) = address.parse() {
                registration = registration.internal_ip(ip);
            }
            if let Some(hardware) = &status.inventory.hardware {
                registration = registration.system_uuid(hardware.uuid.clone());
            }
            // The version its kubelet runs now (the follower keeps it so).
            let node = self
                .nodes
                .iter()
                .find(|n| n.addr().ip().to_string() == *address);
            if let Some(node) = node
                && let Some(version) = node.kubelet_version().await
            {
                registration.kubelet_version = version;
            }
            if machine.spec.role == Some(ichor_api::common::Role::ControlPlane) {
                registration = registration.label("node-role.kubernetes.io/control-plane", "");
            }
            let exists = Api::<k8s_openapi::api::core::v1::Node>::all(plane.client())
                .get_opt(name)
                .await?
                .is_some();
            if !exists {
                plane.register_node(&registration).await?;
            }
            let _ = machine.name_any();
        }
        Ok(())
    }
}
