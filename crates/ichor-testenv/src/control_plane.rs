//! One etcd and one kube-apiserver on free loopback ports, in a temporary folder.

use std::ffi::OsString;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD as B64;
use kube::Client;

use crate::assets::{self, ToolVersions};
use crate::pki::{self, CertAndKey};
use crate::ports::Starts;
use crate::process::{ChildSpec, PGIDS_FILE, Supervised, Watchdog};
use crate::{Connection, Error};

/// The address every management control plane serves on.
const LOOPBACK: IpAddr = IpAddr::V4(Ipv4Addr::LOCALHOST);

/// The `tools/k8s/go.mod` these tests were built against; it names the binaries' versions.
const TOOLS_GO_MOD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/k8s/go.mod"
));

/// How long the apiserver may take to report `/readyz` ok.
const READY_TIMEOUT: Duration = Duration::from_secs(90);

/// The envtest binaries' versions this crate expects.
pub fn tool_versions() -> ToolVersions {
    ToolVersions::from_go_mod(TOOLS_GO_MOD)
        .expect("tools/k8s/go.mod pins k8s.io/kubernetes and etcd")
}

/// The folder binaries are taken from: `KUBEBUILDER_ASSETS` when set, else the build cache.
pub fn default_assets_dir() -> PathBuf {
    assets::assets_dir(&tool_versions())
}

/// Options for starting a [`ControlPlane`].
#[derive(Debug, Clone, Default)]
pub struct ControlPlaneBuilder {
    assets_dir: Option<PathBuf>,
    extra_apiserver_args: Vec<String>,
}

impl ControlPlaneBuilder {
    /// Takes binaries from `dir` instead of the default folder.
    pub fn assets_dir(mut self, dir: impl Into<PathBuf>) -> Self {
        self.assets_dir = Some(dir.into());
        self
    }

    /// Adds a `--flag=value` argument to kube-apiserver.
    pub fn apiserver_arg(mut self, arg: impl Into<String>) -> Self {
        self.extra_apiserver_args.push(arg.into());
        self
    }

    /// Starts etcd and kube-apiserver and waits until `/readyz` answers ok.
    pub async fn start(self) -> Result<ControlPlane, Error> {
        let assets_dir = self.assets_dir.unwrap_or_else(default_assets_dir);
        let missing = assets::missing_binaries(&assets_dir);
        if !missing.is_empty() {
            return Err(Error::MissingAssets {
                dir: assets_dir,
                missing: missing.join(", "),
            });
        }
        ControlPlane::launch(&assets_dir, &self.extra_apiserver_args).await
    }
}

/// A running etcd + kube-apiserver pair. Dropping it kills both and removes its folder.
#[derive(Debug)]
pub struct ControlPlane {
    // Field order is drop order: the processes die before the watchdog removes the folder.
    // Each is `None` while stopped ([`ControlPlane::stop_apiserver`], [`ControlPlane::stop_etcd`]).
    apiserver: Option<Supervised>,
    etcd: Option<Supervised>,
    /// How each was started: a restart runs the same again (same ports, data and certificates).
    apiserver_spec: ChildSpec,
    etcd_spec: ChildSpec,
    /// The apiserver's port, and etcd's client and peer ports: what a restart waits to be free.
    apiserver_port: u16,
    etcd_ports: [u16; 2],
    connection: Connection,
    _watchdog: Watchdog,
    dir: tempfile::TempDir,
}

/// When set, every control plane writes a JSON audit log (metadata of every request except the
/// control plane's own and the test administrator's) into this folder, one file per control
/// plane: what the RBAC audit reads.
pub const AUDIT_DIR_ENV: &str = "ICHOR_AUDIT_DIR";

/// Users whose requests are not audited: the control plane's own and the test administrator.
const UNAUDITED_USERS: &[&str] = &[
    "ichor-testenv-admin",
    "system:apiserver",
    "system:kube-controller-manager",
    "system:kube-scheduler",
];

/// The apiserver arguments that write an audit log for the control plane in `root` into `dir`.
fn audit_args(root: &Path, dir: &Path) -> Result<Vec<String>, Error> {
    std::fs::create_dir_all(dir).map_err(Error::io(format!("create {}", dir.display())))?;
    let users = UNAUDITED_USERS
        .iter()
        .map(|u| format!("\"{u}\""))
        .collect::<Vec<_>>()
        .join(", ");
    let policy = format!(
        "apiVersion: audit.k8s.io/v1\nkind: Policy\nomitStages: [\"RequestReceived\"]\nrules:\n- level: None\n  users: [{users}]\n- level: Metadata\n"
    );
    let policy_file = root.join("audit-policy.yaml");
    write(&policy_file, &policy)?;
    let name = root
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "control-plane".into());
    Ok(vec![
        format!("--audit-policy-file={}", policy_file.display()),
        format!(
            "--audit-log-path={}",
            dir.join(format!("{name}.log")).display()
        ),
        "--audit-log-format=json".into(),
        "--audit-log-mode=blocking".into(),
        // Never rotated, so a count over a window reads one file: a size of 0 opens the file
        // itself instead of a rotating writer (k8s.io/apiserver v0.36.3,
        // pkg/server/options/audit.go, `ensureLogFile`'s caller; the default rotates at 100 MB).
        "--audit-log-maxsize=0".into(),
    ])
}

/// Writes the apiserver's admission configuration into `root`: the webhook admission plugins
/// present the client certificate `client` (to every webhook: the kubeconfig's user `*`);
/// returns the configuration's file. `kubeConfigFile` and the certificate paths are absolute,
/// as kube-apiserver requires.
fn admission_config(root: &Path, client: &CertAndKey) -> Result<PathBuf, Error> {
    let cert = root.join(crate::WEBHOOK_CLIENT_CERT_FILE);
    let key = root.join(crate::WEBHOOK_CLIENT_KEY_FILE);
    write(&cert, &client.cert_pem)?;
    write(&key, &client.key_pem)?;
    let kubeconfig = root.join("webhook-client.kubeconfig");
    write(
        &kubeconfig,
        &format!(
            "apiVersion: v1\nkind: Config\nusers:\n- name: '*'\n  user:\n    client-certificate: {}\n    client-key: {}\n",
            cert.display(),
            key.display()
        ),
    )?;
    let plugin = |name: &str| {
        format!(
            "- name: {name}\n  configuration:\n    apiVersion: apiserver.config.k8s.io/v1\n    kind: WebhookAdmissionConfiguration\n    kubeConfigFile: {}\n",
            kubeconfig.display()
        )
    };
    let config = root.join("admission-config.yaml");
    write(
        &config,
        &format!(
            "apiVersion: apiserver.config.k8s.io/v1\nkind: AdmissionConfiguration\nplugins:\n{}{}",
            plugin("ValidatingAdmissionWebhook"),
            plugin("MutatingAdmissionWebhook")
        ),
    )?;
    Ok(config)
}

/// Writes a file, naming it in the error.
pub(crate) fn write(path: &Path, contents: &str) -> Result<(), Error> {
    std::fs::write(path, contents).map_err(Error::io(format!("write {}", path.display())))
}

/// Stops the process `name` in `slot` (SIGKILL) and takes it out of the pgids file of the
/// folder `root`; nothing when it is not running.
pub(crate) fn stop_process(
    slot: &mut Option<Supervised>,
    name: &str,
    root: &Path,
) -> Result<(), Error> {
    if let Some(process) = slot.take() {
        process
            .discard(&root.join(PGIDS_FILE))
            .map_err(Error::io(format!("stop {name}")))?;
    }
    Ok(())
}

/// Starts the process `name` from `spec`, recorded in the pgids file of the folder `root`.
pub(crate) fn start_process(
    name: &'static str,
    spec: ChildSpec,
    root: &Path,
) -> Result<Supervised, Error> {
    Supervised::start(name, spec, &root.join(PGIDS_FILE))
        .map_err(Error::io(format!("start {name}")))
}

/// Command-line arguments from strings.
pub(crate) fn args(list: &[String]) -> Vec<OsString> {
    list.iter().map(OsString::from).collect()
}

impl ControlPlane {
    /// Options for a new control plane.
    pub fn builder() -> ControlPlaneBuilder {
        ControlPlaneBuilder::default()
    }

    /// Starts a control plane from the default assets folder.
    pub async fn start() -> Result<Self, Error> {
        Self::builder().start().await
    }

    async fn launch(assets_dir: &Path, extra_apiserver_args: &[String]) -> Result<Self, Error> {
        let dir = tempfile::Builder::new()
            .prefix("ichor-testenv-")
            .tempdir()
            .map_err(Error::io("create a temporary folder"))?;
        let root = dir.path().to_path_buf();
        let watchdog = Watchdog::start(&root).map_err(Error::io("start the watchdog"))?;

        let ca = pki::new_ca()?;
        let serving = pki::loopback_server_cert(&ca, "kube-apiserver")?;
        let admin = pki::client_cert(&ca, "ichor-testenv-admin", Some("system:masters"))?;
        let (sa_key, sa_pub) = pki::service_account_keys()?;
        let webhook_ca = pki::new_ca_named("ichor-testenv-webhook-client-ca")?;
        let webhook_client = pki::client_cert(&webhook_ca, "kube-apiserver-webhook-client", None)?;
        let admission = admission_config(&root, &webhook_client)?;
        for (name, contents) in [
            (crate::CA_CERT_FILE, ca.cert_pem.as_str()),
            (crate::WEBHOOK_CLIENT_CA_FILE, webhook_ca.cert_pem.as_str()),
            (crate::CA_KEY_FILE, ca.key_pem.as_str()),
            ("apiserver.crt", serving.cert_pem.as_str()),
            ("apiserver.key", serving.key_pem.as_str()),
            ("sa.key", sa_key.as_str()),
            ("sa.pub", sa_pub.as_str()),
        ] {
            write(&root.join(name), contents)?;
        }

        let mut etcd = start_etcd(assets_dir, &root).await?;
        let p = |name: &str| root.join(name).display().to_string();
        // The port-dependent `--secure-port` and `--service-account-issuer` come first, so
        // that the caller's arguments (last) still override any of these.
        let mut apiserver_args = vec![
            format!("--etcd-servers={}", etcd.url),
            "--bind-address=127.0.0.1".into(),
            "--advertise-address=127.0.0.1".into(),
            format!("--cert-dir={}", p("apiserver-certs")),
            format!("--tls-cert-file={}", p("apiserver.crt")),
            format!("--tls-private-key-file={}", p("apiserver.key")),
            format!("--client-ca-file={}", p(crate::CA_CERT_FILE)),
            "--authorization-mode=RBAC".into(),
            format!("--service-account-key-file={}", p("sa.pub")),
            format!("--service-account-signing-key-file={}", p("sa.key")),
            "--service-cluster-ip-range=10.0.0.0/24".into(),
            "--allow-privileged=true".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--enable-priority-and-fairness=false".into(),
            format!("--admission-control-config-file={}", admission.display()),
        ];
        if let Some(audit_dir) = std::env::var_os(AUDIT_DIR_ENV).filter(|v| !v.is_empty()) {
            apiserver_args.extend(audit_args(&root, Path::new(&audit_dir))?);
        }
        apiserver_args.extend(extra_apiserver_args.iter().cloned());
        let mut starts = Starts::fresh("kube-apiserver", 1);
        let (apiserver, apiserver_spec, apiserver_port, server) = loop {
            let ports = starts.next().await?;
            let started: Result<_, Error> = async {
                let port = ports[0];
                let server = format!("https://127.0.0.1:{port}");
                let mut arguments = vec![
                    format!("--secure-port={port}"),
                    format!("--service-account-issuer={server}"),
                ];
                arguments.extend(apiserver_args.iter().cloned());
                let spec = ChildSpec {
                    program: assets_dir.join("kube-apiserver"),
                    args: args(&arguments),
                    log: root.join("kube-apiserver.log"),
                    env: Vec::new(),
                };
                let mut apiserver = start_process("kube-apiserver", spec.clone(), &root)?;
                let kubeconfig = kubeconfig_yaml(&server, &ca, &admin);
                let ready = match client_from_kubeconfig(&kubeconfig).await {
                    Ok(client) => {
                        wait_readyz(&client, &mut [&mut etcd.process, &mut apiserver]).await
                    }
                    Err(error) => Err(error),
                };
                match ready {
                    Ok(()) => Ok((apiserver, spec, port, server)),
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

        let kubeconfig = kubeconfig_yaml(&server, &ca, &admin);
        write(&root.join(crate::KUBECONFIG_FILE), &kubeconfig)?;
        let mut plane = Self {
            apiserver: Some(apiserver),
            etcd: Some(etcd.process),
            apiserver_spec,
            etcd_spec: etcd.spec,
            apiserver_port,
            etcd_ports: etcd.ports,
            connection: Connection {
                dir: root,
                server,
                kubeconfig,
                ca,
            },
            _watchdog: watchdog,
            dir,
        };
        plane.wait_ready().await?;
        Ok(plane)
    }

    async fn wait_ready(&mut self) -> Result<(), Error> {
        let client = self.connection.client().await?;
        let mut running: Vec<&mut Supervised> = self
            .etcd
            .iter_mut()
            .chain(self.apiserver.iter_mut())
            .collect();
        wait_readyz(&client, &mut running).await
    }

    /// Stops kube-apiserver (SIGKILL): its API stops answering; etcd and everything stored
    /// stay for [`start_apiserver`](Self::start_apiserver).
    pub fn stop_apiserver(&mut self) -> Result<(), Error> {
        stop_process(&mut self.apiserver, "kube-apiserver", self.dir.path())
    }

    /// Starts kube-apiserver again after [`stop_apiserver`](Self::stop_apiserver), on the same
    /// port (once it is free) with the same certificates and etcd, so every kubeconfig still
    /// works, and the same audit log, which it appends to; waits until it is ready (etcd must
    /// run).
    pub async fn start_apiserver(&mut self) -> Result<(), Error> {
        if self.apiserver.is_some() {
            return self.wait_ready().await;
        }
        let mut starts = Starts::same("kube-apiserver", LOOPBACK, &[self.apiserver_port]);
        loop {
            starts.next().await?;
            let started: Result<_, Error> = async {
                self.apiserver = Some(start_process(
                    "kube-apiserver",
                    self.apiserver_spec.clone(),
                    self.dir.path(),
                )?);
                let ready = self.wait_ready().await;
                if ready.is_err() {
                    stop_process(&mut self.apiserver, "kube-apiserver", self.dir.path())?;
                }
                ready
            }
            .await;
            match started {
                Ok(started) => return Ok(started),
                Err(error) => starts.retry(error)?,
            }
        }
    }

    /// Stops etcd (SIGKILL), as a crash would: the apiserver stays up and fails what needs
    /// storage until [`start_etcd`](Self::start_etcd).
    pub fn stop_etcd(&mut self) -> Result<(), Error> {
        stop_process(&mut self.etcd, "etcd", self.dir.path())
    }

    /// Starts etcd again after [`stop_etcd`](Self::stop_etcd), on the same ports (once they
    /// are free) over the same data, and waits until the apiserver (when it runs) is ready
    /// again.
    pub async fn start_etcd(&mut self) -> Result<(), Error> {
        if self.etcd.is_none() {
            let ports = self.etcd_ports;
            let mut starts = Starts::same("etcd", LOOPBACK, &ports);
            loop {
                starts.next().await?;
                let started: Result<_, Error> = async {
                    let mut etcd = start_process("etcd", self.etcd_spec.clone(), self.dir.path())?;
                    match etcd_ready(&mut etcd, ports[0]).await {
                        Ok(()) => {
                            self.etcd = Some(etcd);
                            Ok(())
                        }
                        Err(error) => {
                            stop_process(&mut Some(etcd), "etcd", self.dir.path())?;
                            Err(error)
                        }
                    }
                }
                .await;
                match started {
                    Ok(started) => break started,
                    Err(error) => starts.retry(error)?,
                }
            }
        }
        if self.apiserver.is_some() {
            self.wait_ready().await
        } else {
            Ok(())
        }
    }

    /// How to reach this control plane.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// The folder holding its certificates, kubeconfig, data and logs.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The process ids of etcd and kube-apiserver (each also its process group); 0 for one
    /// that is stopped.
    pub fn pids(&self) -> [u32; 2] {
        [
            self.etcd.as_ref().map_or(0, Supervised::pid),
            self.apiserver.as_ref().map_or(0, Supervised::pid),
        ]
    }
}

/// A started etcd: its process, client URL, client and peer ports, and how it was started (to
/// start it again over the same data and ports).
pub(crate) struct Etcd {
    pub(crate) process: Supervised,
    pub(crate) url: String,
    pub(crate) ports: [u16; 2],
    pub(crate) spec: ChildSpec,
}

/// Starts etcd on fresh loopback ports ([`Starts`]), its data in `root/etcd`, and waits
/// until it serves.
pub(crate) async fn start_etcd(assets_dir: &Path, root: &Path) -> Result<Etcd, Error> {
    start_etcd_on(Starts::fresh("etcd", 2), assets_dir, root).await
}

/// [`start_etcd`] on the ports of `starts` (client, then peer).
async fn start_etcd_on(mut starts: Starts, assets_dir: &Path, root: &Path) -> Result<Etcd, Error> {
    loop {
        let ports = starts.next().await?;
        let started: Result<_, Error> = async {
            let (client_port, peer_port) = (ports[0], ports[1]);
            let url = format!("http://127.0.0.1:{client_port}");
            let peer_url = format!("http://127.0.0.1:{peer_port}");
            let _ = std::fs::remove_dir_all(root.join("etcd"));
            let spec = ChildSpec {
                program: assets_dir.join("etcd"),
                args: args(&[
                    "--name=testenv".into(),
                    format!("--data-dir={}", root.join("etcd").display()),
                    format!("--listen-client-urls={url}"),
                    format!("--advertise-client-urls={url}"),
                    format!("--listen-peer-urls={peer_url}"),
                    format!("--initial-advertise-peer-urls={peer_url}"),
                    format!("--initial-cluster=testenv={peer_url}"),
                    "--unsafe-no-fsync=true".into(),
                    "--log-level=warn".into(),
                ]),
                log: root.join("etcd.log"),
                env: Vec::new(),
            };
            let mut process = start_process("etcd", spec.clone(), root)?;
            match etcd_ready(&mut process, client_port).await {
                Ok(()) => Ok(Etcd {
                    process,
                    url,
                    ports: [client_port, peer_port],
                    spec,
                }),
                Err(error) => {
                    stop_process(&mut Some(process), "etcd", root)?;
                    Err(error)
                }
            }
        }
        .await;
        match started {
            Ok(started) => return Ok(started),
            Err(error) => starts.retry(error)?,
        }
    }
}

/// Waits until the etcd in `etcd` answers `/health` healthy on its client `port` (an answer
/// only etcd gives, so not another process that took the port), failing as soon as it exits.
async fn etcd_ready(etcd: &mut Supervised, port: u16) -> Result<(), Error> {
    let address = SocketAddr::from((LOOPBACK, port));
    let deadline = Instant::now() + READY_TIMEOUT;
    let mut last = String::from("no answer");
    loop {
        etcd.check_running().map_err(Error::Startup)?;
        if let Some((status, body)) = http_get(address, "/health").await {
            if status == 200 && body.contains(r#""health":"true""#) {
                return Ok(());
            }
            last = format!("{status} {}", body.trim());
        }
        if Instant::now() > deadline {
            return Err(Error::Startup(format!(
                "etcd not healthy on {address} after {READY_TIMEOUT:?}: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `GET http://<address><path>`: the status code and body, or nothing when it does not answer
/// within two seconds.
pub(crate) async fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let exchange = async {
        let mut stream = tokio::net::TcpStream::connect(address).await?;
        stream
            .write_all(
                format!("GET {path} HTTP/1.0\r\nHost: {address}\r\nConnection: close\r\n\r\n")
                    .as_bytes(),
            )
            .await?;
        let mut response = Vec::new();
        stream.read_to_end(&mut response).await?;
        std::io::Result::Ok(response)
    };
    let response = tokio::time::timeout(Duration::from_secs(2), exchange)
        .await
        .ok()?
        .ok()?;
    let text = String::from_utf8_lossy(&response);
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n").map_or("", |(_, body)| body);
    Some((status, body.to_owned()))
}

/// Polls the apiserver's `/readyz` through `client` until it answers ok, failing as soon as one
/// of `processes` has exited.
pub(crate) async fn wait_readyz(
    client: &Client,
    processes: &mut [&mut Supervised],
) -> Result<(), Error> {
    let deadline = Instant::now() + READY_TIMEOUT;
    loop {
        for process in processes.iter_mut() {
            process.check_running().map_err(Error::Startup)?;
        }
        let request = http::Request::get("/readyz")
            .body(Vec::new())
            .expect("a static request is valid");
        let last = match client.request_text(request).await {
            Ok(body) if body.trim() == "ok" => return Ok(()),
            Ok(body) => body,
            Err(err) => err.to_string(),
        };
        if Instant::now() > deadline {
            return Err(Error::Startup(format!(
                "kube-apiserver not ready after {READY_TIMEOUT:?}: {last}"
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A kubeconfig with one context, `ichor-testenv`, for `client`.
pub fn kubeconfig_yaml(server: &str, ca: &CertAndKey, client: &CertAndKey) -> String {
    format!(
        "apiVersion: v1\nkind: Config\nclusters:\n- name: ichor-testenv\n  cluster:\n    server: {server}\n    certificate-authority-data: {ca}\nusers:\n- name: ichor-testenv\n  user:\n    client-certificate-data: {cert}\n    client-key-data: {key}\ncontexts:\n- name: ichor-testenv\n  context:\n    cluster: ichor-testenv\n    user: ichor-testenv\ncurrent-context: ichor-testenv\n",
        ca = B64.encode(&ca.cert_pem),
        cert = B64.encode(&client.cert_pem),
        key = B64.encode(&client.key_pem),
    )
}

/// Builds a client from kubeconfig YAML, using its `ichor-testenv` context.
pub async fn client_from_kubeconfig(yaml: &str) -> Result<Client, Error> {
    let kubeconfig = kube::config::Kubeconfig::from_yaml(yaml).map_err(Error::Kubeconfig)?;
    let options = kube::config::KubeConfigOptions {
        context: Some("ichor-testenv".into()),
        ..Default::default()
    };
    let config = kube::Config::from_custom_kubeconfig(kubeconfig, &options)
        .await
        .map_err(Error::Kubeconfig)?;
    Client::try_from(config).map_err(Error::Kube)
}

#[cfg(test)]
mod tests {
    use std::net::TcpListener;
    use std::sync::{Arc, Mutex};

    use super::*;

    #[tokio::test]
    async fn etcd_starts_on_other_ports_when_its_first_client_port_was_taken() {
        let root = tempfile::tempdir().expect("a folder");
        let _watchdog = Watchdog::start(root.path()).expect("watchdog");
        let taken: Arc<Mutex<Option<TcpListener>>> = Arc::default();
        let hold = Arc::clone(&taken);
        let ports = Starts::fresh("etcd", 2).after_pick(move |ports| {
            let mut hold = hold.lock().expect("lock");
            if hold.is_none() {
                // Another test's server binds the client port between pick and start.
                *hold = Some(TcpListener::bind((LOOPBACK, ports[0])).expect("take the port"));
            }
        });
        let etcd = start_etcd_on(ports, &default_assets_dir(), root.path())
            .await
            .expect("etcd starts on fresh ports");
        let first = taken
            .lock()
            .expect("lock")
            .as_ref()
            .and_then(|l| l.local_addr().ok())
            .expect("the taken port")
            .port();
        assert_ne!(etcd.ports[0], first, "etcd serves on a fresh client port");
        let health = http_get(SocketAddr::from((LOOPBACK, etcd.ports[0])), "/health").await;
        assert!(
            health.is_some_and(|(status, _)| status == 200),
            "etcd answers on its client port"
        );
    }
}
