//! Test support: a real etcd and kube-apiserver, started from binaries built by
//! `cargo xtask envtest-assets` (or taken from `KUBEBUILDER_ASSETS`), for every test whose
//! behaviour the apiserver owns — CEL rules, pruning, admission webhooks, admission policies,
//! RBAC, leases.
//!
//! Two ways to get one:
//!
//! - [`TestEnv::shared`]: the control plane of the whole run. `cargo xtask test` starts one and
//!   exports its folder in `ICHOR_TESTENV_DIR`; under a plain `cargo test` each test process
//!   starts one the first time it is asked. Tests isolate themselves by namespace
//!   ([`TestEnv::namespace`]).
//! - [`TestEnv::private`]: a control plane of the test's own, for tests that restart the
//!   apiserver or register cluster-scoped admission objects ([`TestEnv::register_webhook`]).
//!
//! A simulated workload cluster's control plane — the apiserver serving with the cluster's own
//! Kubernetes CA, kube-controller-manager, and kwok playing the kubelets — is
//! [`WorkloadControlPlane`] (see [`workload`]).
//!
//! A real S3-compatible object store (SeaweedFS, for the backup tests) is [`S3Server`]; a real
//! Redfish service (sushy-tools' emulator, for the BMC tests) is [`SushyEmulator`].
//!
//! Shared by every test besides: [`wait::eventually`] (poll until a condition holds) and
//! [`rng`] (seeded, replayable randomness).
//!
//! Every server here starts through [`ports`], which picks its ports and starts it again when
//! another test took one first.
//! The simulated Talos networks (`127.0.<net>.x`) each test file uses are registered in
//! [`nets`].
//!
//! Every kube-apiserver here presents a client certificate to the webhooks it calls (its
//! admission configuration), signed by a CA of its own ([`Connection::webhook_client_ca_file`]),
//! so that a webhook under test can require one, as the chart documents (ADR 0051).
//!
//! Missing binaries are an error that says how to build them; a test never skips.
//! Child processes die with the process that started them, and their folder goes with them
//! (see [`process`]).
#![forbid(unsafe_code)]

pub mod assets;
mod control_plane;
pub mod nets;
pub mod pki;
pub mod ports;
pub mod process;
pub mod redfish;
pub mod rng;
pub mod s3;
pub mod tuning;
pub mod wait;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::ByteString;
use k8s_openapi::api::admissionregistration::v1::{
    RuleWithOperations, ValidatingWebhook, ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Api, Client};
use tokio::sync::OnceCell;

pub use control_plane::{
    AUDIT_DIR_ENV, ControlPlane, ControlPlaneBuilder, client_from_kubeconfig, default_assets_dir,
    kubeconfig_yaml, tool_versions,
};
pub use pki::CertAndKey;
pub use redfish::{FakeSystem, SushyEmulator, SushyEmulatorBuilder};
pub use s3::{S3Server, S3ServerBuilder};
pub use workload::{NodeRegistration, WorkloadControlPlane, WorkloadSpec};

/// Names the folder of the run's shared control plane (set by `cargo xtask test`).
pub const SHARED_DIR_ENV: &str = "ICHOR_TESTENV_DIR";
/// The kubeconfig's file name inside a control plane's folder.
pub const KUBECONFIG_FILE: &str = "kubeconfig";
/// The CA certificate's file name inside a control plane's folder.
pub const CA_CERT_FILE: &str = "ca.crt";
/// The CA key's file name inside a control plane's folder.
pub const CA_KEY_FILE: &str = "ca.key";
/// The file, inside a control plane's folder, of the CA that signed the client certificate its
/// apiserver presents to every webhook (a webhook's client CA, ADR 0051).
pub const WEBHOOK_CLIENT_CA_FILE: &str = "webhook-client-ca.crt";
/// The apiserver's webhook client certificate's file inside a control plane's folder.
pub const WEBHOOK_CLIENT_CERT_FILE: &str = "webhook-client.crt";
/// Its key's file.
pub const WEBHOOK_CLIENT_KEY_FILE: &str = "webhook-client.key";

/// The field manager used for objects this crate applies.
const FIELD_MANAGER: &str = "ichor-testenv";

/// What can go wrong starting or using a test control plane.
///
/// `Debug` prints the message and its causes, so a test's `expect` shows what to do (e.g.
/// which command builds the missing binaries) rather than a struct dump.
#[derive(thiserror::Error)]
pub enum Error {
    /// The envtest binaries are not where they should be.
    #[error(
        "envtest binaries missing from {dir}: {missing}; run `cargo xtask envtest-assets` to build them (or set KUBEBUILDER_ASSETS to a folder holding them)",
        dir = dir.display()
    )]
    MissingAssets {
        /// The folder searched.
        dir: PathBuf,
        /// The binaries not found there.
        missing: String,
    },
    /// A local operation failed.
    #[error("cannot {action}")]
    Io {
        /// What was being done.
        action: String,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// The shared control plane's folder could not be read.
    #[error("{SHARED_DIR_ENV}={dir} does not hold a usable control plane")]
    SharedDir {
        /// The folder named by the variable.
        dir: PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// A process failed to start or the apiserver never became ready.
    #[error("control plane failed to start: {0}")]
    Startup(String),
    /// A test tool is not where the variable naming it points, or the variable is unset (the
    /// message says which command installs it).
    #[error("{0}")]
    MissingTool(String),
    /// A server lost a port it was given to another process at every start ([`ports`]).
    #[error("{server} lost a port to another process at each of {attempts} starts (ports {ports})")]
    PortLost {
        /// The server.
        server: String,
        /// How many starts were tried.
        attempts: usize,
        /// The ports each start was given.
        ports: String,
        /// Why the last start failed.
        #[source]
        last: Box<Error>,
    },
    /// Certificate generation failed.
    #[error("cannot mint a certificate")]
    Certificate(#[from] rcgen::Error),
    /// A kubeconfig could not be turned into a client configuration.
    #[error("invalid kubeconfig")]
    Kubeconfig(#[source] kube::config::KubeconfigError),
    /// A request to the apiserver failed.
    #[error("kubernetes request failed")]
    Kube(#[source] kube::Error),
    /// Waiting for a condition failed or timed out.
    #[error("timed out waiting for {0}")]
    Timeout(String),
    /// A cluster-scoped admission object was about to be registered on the shared control plane.
    #[error(
        "register webhooks on a private control plane (TestEnv::private): the shared one serves other tests"
    )]
    SharedAdmission,
}

impl std::fmt::Debug for Error {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self}")?;
        let mut source = std::error::Error::source(self);
        while let Some(cause) = source {
            write!(f, ": {cause}")?;
            source = cause.source();
        }
        Ok(())
    }
}

impl Error {
    fn io(action: impl Into<String>) -> impl FnOnce(std::io::Error) -> Self {
        let action = action.into();
        move |source| Self::Io { action, source }
    }
}

/// How to reach a control plane: its folder, address, admin kubeconfig and CA.
#[derive(Clone)]
pub struct Connection {
    dir: PathBuf,
    server: String,
    kubeconfig: String,
    ca: CertAndKey,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("dir", &self.dir)
            .field("server", &self.server)
            .finish_non_exhaustive()
    }
}

impl Connection {
    /// Reads a connection from a control plane's folder (as written by [`ControlPlane`]).
    pub fn from_dir(dir: impl Into<PathBuf>) -> Result<Self, Error> {
        let dir = dir.into();
        let read = |name: &str| {
            std::fs::read_to_string(dir.join(name)).map_err(|source| Error::SharedDir {
                dir: dir.clone(),
                source,
            })
        };
        let kubeconfig = read(KUBECONFIG_FILE)?;
        let ca = CertAndKey {
            cert_pem: read(CA_CERT_FILE)?,
            key_pem: read(CA_KEY_FILE)?,
        };
        let server = kubeconfig
            .lines()
            .find_map(|l| l.trim().strip_prefix("server: "))
            .unwrap_or_default()
            .to_owned();
        Ok(Self {
            dir,
            server,
            kubeconfig,
            ca,
        })
    }

    /// The control plane's folder.
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The apiserver's URL (`https://127.0.0.1:PORT`).
    pub fn server(&self) -> &str {
        &self.server
    }

    /// The admin (`system:masters`) kubeconfig, YAML.
    pub fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    /// The PEM certificate of the CA that signed the apiserver's and clients' certificates.
    pub fn ca_cert_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The file of the CA that signed the client certificate the apiserver presents to every
    /// webhook it calls (its admission configuration's `kubeConfigFile`): what a webhook
    /// verifies callers with.
    pub fn webhook_client_ca_file(&self) -> PathBuf {
        self.dir.join(WEBHOOK_CLIENT_CA_FILE)
    }

    /// The client certificate and key the apiserver presents to webhooks: for a test that
    /// calls a webhook as the apiserver would.
    pub fn webhook_client(&self) -> Result<CertAndKey, Error> {
        let read = |name: &str| {
            let path = self.dir.join(name);
            std::fs::read_to_string(&path).map_err(Error::io(format!("read {}", path.display())))
        };
        Ok(CertAndKey {
            cert_pem: read(WEBHOOK_CLIENT_CERT_FILE)?,
            key_pem: read(WEBHOOK_CLIENT_KEY_FILE)?,
        })
    }

    /// An admin client.
    pub async fn client(&self) -> Result<Client, Error> {
        client_from_kubeconfig(&self.kubeconfig).await
    }

    /// A kubeconfig for `user` in `group` (or no group), signed by the control plane's CA.
    pub fn kubeconfig_for(&self, user: &str, group: Option<&str>) -> Result<String, Error> {
        let cert = pki::client_cert(&self.ca, user, group)?;
        Ok(kubeconfig_yaml(&self.server, &self.ca, &cert))
    }
}

static PROCESS_SHARED: OnceCell<ControlPlane> = OnceCell::const_new();

/// A control plane for one test: the run's shared one, or a private one.
pub struct TestEnv {
    connection: Connection,
    client: Client,
    private: Option<ControlPlane>,
}

impl std::fmt::Debug for TestEnv {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestEnv")
            .field("connection", &self.connection)
            .field("private", &self.private.is_some())
            .finish_non_exhaustive()
    }
}

impl TestEnv {
    /// The run's shared control plane: the one named by `ICHOR_TESTENV_DIR`, else one started
    /// for this test process on first use.
    pub async fn shared() -> Result<Self, Error> {
        let connection = match std::env::var_os(SHARED_DIR_ENV).filter(|v| !v.is_empty()) {
            Some(dir) => Connection::from_dir(dir)?,
            None => PROCESS_SHARED
                .get_or_try_init(ControlPlane::start)
                .await?
                .connection()
                .clone(),
        };
        let client = connection.client().await?;
        Ok(Self {
            connection,
            client,
            private: None,
        })
    }

    /// A control plane of this test's own, stopped when the `TestEnv` is dropped.
    pub async fn private() -> Result<Self, Error> {
        Self::from_control_plane(ControlPlane::start().await?).await
    }

    /// Wraps a control plane started with custom options.
    pub async fn from_control_plane(plane: ControlPlane) -> Result<Self, Error> {
        let connection = plane.connection().clone();
        let client = connection.client().await?;
        Ok(Self {
            connection,
            client,
            private: Some(plane),
        })
    }

    /// An admin client.
    pub fn client(&self) -> Client {
        self.client.clone()
    }

    /// How to reach this control plane.
    pub fn connection(&self) -> &Connection {
        &self.connection
    }

    /// This test's own control plane, to stop and start its parts; none for the shared one.
    pub fn private_mut(&mut self) -> Option<&mut ControlPlane> {
        self.private.as_mut()
    }

    /// Whether this control plane belongs to this test alone.
    pub fn is_private(&self) -> bool {
        self.private.is_some()
    }

    /// A client authenticated as `user` in `group` by a client certificate.
    pub async fn client_as(&self, user: &str, group: Option<&str>) -> Result<Client, Error> {
        client_from_kubeconfig(&self.connection.kubeconfig_for(user, group)?).await
    }

    /// Creates a namespace named `<prefix>-<random>` and returns its name.
    pub async fn namespace(&self, prefix: &str) -> Result<String, Error> {
        let suffix: u32 = rand::random();
        let name = format!("{prefix}-{suffix:08x}");
        let ns = Namespace {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                labels: Some([("ichor.maesh.dev/testenv".to_owned(), "true".to_owned())].into()),
                ..Default::default()
            },
            ..Default::default()
        };
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &ns)
            .await
            .map_err(Error::Kube)?;
        Ok(name)
    }

    /// Applies CRDs (server-side apply) and waits until each is established.
    pub async fn install_crds(
        &self,
        crds: impl IntoIterator<Item = CustomResourceDefinition>,
    ) -> Result<(), Error> {
        let api = Api::<CustomResourceDefinition>::all(self.client.clone());
        let params = PatchParams::apply(FIELD_MANAGER).force();
        let mut names = Vec::new();
        for crd in crds {
            let name = crd.metadata.name.clone().unwrap_or_default();
            api.patch(&name, &params, &Patch::Apply(&crd))
                .await
                .map_err(Error::Kube)?;
            names.push(name);
        }
        for name in names {
            let established = await_condition(api.clone(), &name, conditions::is_crd_established());
            tokio::time::timeout(Duration::from_secs(30), established)
                .await
                .map_err(|_| Error::Timeout(format!("CRD {name} to be established")))?
                .map_err(|e| Error::Timeout(format!("CRD {name} to be established: {e}")))?;
        }
        Ok(())
    }

    /// Registers a validating webhook called at `url` (`https://127.0.0.1:PORT/path`), trusting
    /// `ca_bundle_pem`, for `rules`. Only on a private control plane: it is cluster-scoped.
    pub async fn register_webhook(
        &self,
        name: &str,
        url: &str,
        ca_bundle_pem: &str,
        rules: Vec<RuleWithOperations>,
    ) -> Result<(), Error> {
        if !self.is_private() {
            return Err(Error::SharedAdmission);
        }
        let config = ValidatingWebhookConfiguration {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                ..Default::default()
            },
            webhooks: Some(vec![ValidatingWebhook {
                name: format!("{name}.testenv.ichor.maesh.dev"),
                admission_review_versions: vec!["v1".into()],
                side_effects: "None".into(),
                failure_policy: Some("Fail".into()),
                timeout_seconds: Some(10),
                client_config: WebhookClientConfig {
                    url: Some(url.to_owned()),
                    ca_bundle: Some(ByteString(ca_bundle_pem.as_bytes().to_vec())),
                    service: None,
                },
                rules: Some(rules),
                ..Default::default()
            }]),
        };
        Api::<ValidatingWebhookConfiguration>::all(self.client.clone())
            .patch(
                name,
                &PatchParams::apply(FIELD_MANAGER).force(),
                &Patch::Apply(&config),
            )
            .await
            .map_err(Error::Kube)?;
        Ok(())
    }
}
