//! A Talos node simulator speaking the same gRPC API as real nodes, for tests and the local
//! demo. Every behaviour follows `talos-facts.md`; each cites the fact it models.
//!
//! So far:
//! - **maintenance mode** (talos-facts §2): a self-signed Ed25519 certificate regenerated on
//!   every boot, no client certificates, every caller `os:reader`; `Version` and the hardware
//!   resources answer; methods above `os:reader` are refused; etcd reads answer as on a machine
//!   whose type is not set (§1.2);
//! - **apply in maintenance** (§1.2, §5): configs parsed (invalid ones and, on 1.13, 1.14-only
//!   documents refused with `InvalidArgument`), `REBOOT` mapped to `NO_REBOOT`; the node then
//!   installs if told to and comes back configured — a control plane behind mutual TLS, a worker
//!   silent until trustd (§5, not simulated yet);
//! - a **configured control plane** (also bootable directly from a rendered config): mutual
//!   TLS with the config's OS CA, roles per method from the client certificate (§1.2, §2);
//! - faults: a different certificate, a certificate whose key the node does not hold.
//!
//! Install stages and timing, etcd membership and bootstrap, workers via trustd, reset, the
//! remaining faults and gates come next.
#![forbid(unsafe_code)]

mod configured;
mod cosi;
pub mod hardware;
mod maintenance;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use ichor_talos::api::cosi::resource::state_server::StateServer;
use ichor_talos::api::machine::machine_service_server::MachineServiceServer;
use std::sync::Mutex as StdMutex;

use tokio::sync::{Mutex, oneshot};
use tokio::task::JoinHandle;
use tonic::transport::Server;

pub use hardware::{Hardware, SimDisk, SimLink};

/// The answer to a call whose behaviour the simulator does not model yet: `Unimplemented`,
/// saying so, never a made-up success.
pub(crate) fn not_simulated(what: &str) -> tonic::Status {
    tonic::Status::unimplemented(format!("{what} is not simulated yet"))
}

/// What can go wrong running a simulated node.
#[derive(Debug, thiserror::Error)]
pub enum SimError {
    /// The boot certificate could not be made.
    #[error("cannot generate the maintenance certificate")]
    Certificate(#[from] rcgen::Error),
    /// The listener could not be bound or served.
    #[error("cannot serve on {addr}")]
    Serve {
        /// The address.
        addr: SocketAddr,
        /// The I/O error.
        #[source]
        source: std::io::Error,
    },
    /// TLS could not be configured.
    #[error("cannot configure TLS: {0}")]
    TlsSetup(String),
    /// The config given to boot with is not one this simulator can run.
    #[error("invalid machine config: {0}")]
    InvalidConfig(String),
}

/// What the node runs: nothing yet (maintenance), or an applied config.
#[derive(Debug, Clone)]
pub(crate) enum Mode {
    Maintenance,
    Configured(AppliedConfig),
    /// A worker with its config: its API comes up only once it reaches trustd on a
    /// bootstrapped control plane (talos-facts §5), which is not simulated yet, so it does not
    /// answer.
    WorkerWaiting,
}

/// What the simulator takes from an applied config (talos-facts §4.2): the machine type and
/// the OS CA (and accepted CAs) that mutual TLS trusts.
#[derive(Debug, Clone)]
pub(crate) struct AppliedConfig {
    machine_type: String,
    install: bool,
    os_ca_crt: String,
    os_ca_key: String,
    accepted_cas: Vec<String>,
}

/// Base64 of PEM, as the v1alpha1 document writes `crt` and `key` (talos-facts §4.2).
fn pem_field(value: &serde_json::Value, path: &str) -> Result<String, SimError> {
    use base64::Engine as _;
    let text = value.as_str().unwrap_or_default();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(text)
        .map_err(|_| SimError::InvalidConfig(format!("{path} is not base64")))?;
    String::from_utf8(bytes).map_err(|_| SimError::InvalidConfig(format!("{path} is not PEM")))
}

impl AppliedConfig {
    /// Reads the v1alpha1 document of a multi-document config.
    pub(crate) fn parse(yaml: &str) -> Result<Self, SimError> {
        let documents: Vec<serde_json::Value> = serde_saphyr::from_multiple(yaml)
            .map_err(|e| SimError::InvalidConfig(format!("not a YAML document stream: {e}")))?;
        let v1alpha1 = documents
            .iter()
            .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none())
            .ok_or_else(|| SimError::InvalidConfig("no v1alpha1 document".into()))?;
        let machine = &v1alpha1["machine"];
        let machine_type = machine["type"].as_str().unwrap_or_default().to_owned();
        if !matches!(machine_type.as_str(), "controlplane" | "worker") {
            return Err(SimError::InvalidConfig(format!(
                "machine.type {machine_type:?}"
            )));
        }
        let accepted_cas = machine["acceptedCAs"]
            .as_array()
            .into_iter()
            .flatten()
            .map(|ca| pem_field(&ca["crt"], "machine.acceptedCAs[].crt"))
            .collect::<Result<_, _>>()?;
        // Install instructions: machine.install on contract 1.13, UnattendedInstallConfig with
        // reboot or an installer image on 1.14 (talos-facts §5, §8.2).
        let install = machine.get("install").is_some_and(|i| !i.is_null())
            || documents.iter().any(|d| {
                d["kind"] == "UnattendedInstallConfig"
                    && (d["reboot"] == true || d["installer"]["image"].is_string())
            });
        Ok(Self {
            machine_type,
            install,
            os_ca_crt: pem_field(&machine["ca"]["crt"], "machine.ca.crt")?,
            os_ca_key: pem_field(&machine["ca"]["key"], "machine.ca.key")?,
            accepted_cas,
        })
    }
}

/// The node's identity that survives reboots.
#[derive(Debug, Clone)]
struct NodeIdentity {
    talos_version: String,
    hardware: Hardware,
}

impl SimNode {
    /// Boots a node that already runs `config` (a rendered multi-document machine config, as
    /// if applied and installed before): mutual TLS with the config's OS CA.
    pub async fn start_configured(
        addr: SocketAddr,
        talos_version: &str,
        hardware: Hardware,
        config: &str,
    ) -> Result<Self, SimError> {
        let applied = AppliedConfig::parse(config)?;
        if applied.os_ca_key.is_empty() {
            // A worker has no OS CA key: its API certificate comes from trustd on a
            // bootstrapped control plane (talos-facts §5), which is not simulated yet.
            return Err(SimError::InvalidConfig(format!(
                "a {} without the OS CA key gets its API certificate from trustd, not simulated yet",
                applied.machine_type
            )));
        }
        Self::launch(addr, talos_version, hardware, Mode::Configured(applied)).await
    }
}

/// A running server: how to stop it, its task, and the task accepting its connections.
type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
    JoinHandle<()>,
);

/// A simulated node, serving on its address until stopped. The node's state lives behind a
/// lock so that the node itself can move on (apply, install, reboot) while a test holds this
/// handle.
#[derive(Debug)]
pub struct SimNode {
    addr: SocketAddr,
    identity: Arc<NodeIdentity>,
    fingerprint: Arc<StdMutex<String>>,
    node: Arc<Mutex<Node>>,
}

/// The node's state.
#[derive(Debug)]
pub(crate) struct Node {
    addr: SocketAddr,
    identity: Arc<NodeIdentity>,
    mode: Mode,
    fingerprint: Arc<StdMutex<String>>,
    certificate: Option<rustls::pki_types::CertificateDer<'static>>,
    resolver: Option<Arc<tls::Resolver>>,
    server: Option<Running>,
    /// Whether the applied config installed Talos to disk.
    installed: bool,
}

/// A fault a test injects into a running node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The node presents a different certificate from now on (as after an unnoticed reboot).
    DifferentCertificate,
    /// The node presents its certificate but does not hold its key: every handshake fails.
    MismatchedKey,
}

impl SimNode {
    /// Boots a small VM ([`Hardware::vm`]) in maintenance mode on `addr` (port 0 picks one).
    pub async fn start(addr: SocketAddr, talos_version: &str) -> Result<Self, SimError> {
        Self::start_with(addr, talos_version, Hardware::vm(0)).await
    }

    /// Boots a node with the given hardware in maintenance mode on `addr`.
    pub async fn start_with(
        addr: SocketAddr,
        talos_version: &str,
        hardware: Hardware,
    ) -> Result<Self, SimError> {
        Self::launch(addr, talos_version, hardware, Mode::Maintenance).await
    }

    async fn launch(
        addr: SocketAddr,
        talos_version: &str,
        hardware: Hardware,
        mode: Mode,
    ) -> Result<Self, SimError> {
        let identity = Arc::new(NodeIdentity {
            talos_version: talos_version.to_owned(),
            hardware,
        });
        let fingerprint = Arc::new(StdMutex::new(String::new()));
        let node = Arc::new(Mutex::new(Node {
            addr,
            identity: Arc::clone(&identity),
            mode,
            fingerprint: Arc::clone(&fingerprint),
            certificate: None,
            resolver: None,
            server: None,
            installed: false,
        }));
        let addr = {
            let mut guard = node.lock().await;
            guard.boot(Arc::downgrade(&node)).await?;
            guard.addr
        };
        Ok(Self {
            addr,
            identity,
            fingerprint,
            node,
        })
    }

    /// Reboots the node: it goes away and comes back on the same address; in maintenance mode
    /// with a new certificate, so its fingerprint changes (talos-facts §8.2).
    pub async fn reboot(&self) -> Result<(), SimError> {
        let mut node = self.node.lock().await;
        node.shut_down().await;
        node.boot(Arc::downgrade(&self.node)).await
    }

    /// Injects a fault into the running node. Returns the fingerprint the node now presents.
    pub async fn inject(&self, fault: Fault) -> Result<String, SimError> {
        self.node.lock().await.inject(fault)
    }

    /// Stops the node.
    pub async fn stop(self) {
        self.node.lock().await.shut_down().await;
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The machine's hardware.
    pub fn hardware(&self) -> &Hardware {
        &self.identity.hardware
    }

    /// The fingerprint of the certificate of the current boot, as `talosctl` pins it.
    pub fn fingerprint(&self) -> String {
        self.fingerprint
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default()
    }

    /// Whether the applied config installed Talos to disk (`machine.install` on 1.13, an
    /// `UnattendedInstallConfig` on 1.14; talos-facts §8.2).
    pub async fn installed(&self) -> bool {
        self.node.lock().await.installed
    }

    /// Whether the node answers on its address (a worker waiting for trustd does not).
    pub async fn is_serving(&self) -> bool {
        self.node.lock().await.server.is_some()
    }
}

impl Node {
    async fn boot(&mut self, this: std::sync::Weak<Mutex<Node>>) -> Result<(), SimError> {
        if matches!(self.mode, Mode::WorkerWaiting) {
            return Ok(());
        }
        let listener = tokio::net::TcpListener::bind(self.addr)
            .await
            .map_err(|source| SimError::Serve {
                addr: self.addr,
                source,
            })?;
        self.addr = listener.local_addr().map_err(|source| SimError::Serve {
            addr: self.addr,
            source,
        })?;
        let (boot, client_auth) = match &self.mode {
            Mode::Maintenance | Mode::WorkerWaiting => {
                (tls::boot_certificate()?, tls::ClientAuth::None)
            }
            Mode::Configured(c) => {
                let mut cas = vec![c.os_ca_crt.clone()];
                cas.extend(c.accepted_cas.iter().cloned());
                (
                    tls::node_certificate(&c.os_ca_crt, &c.os_ca_key, self.addr.ip())?,
                    tls::ClientAuth::Required(cas),
                )
            }
        };
        if let Ok(mut fingerprint) = self.fingerprint.lock() {
            fingerprint.clone_from(&boot.fingerprint);
        }
        self.certificate = Some(boot.der);
        let resolver = Arc::new(tls::Resolver::new(boot.certified));
        self.resolver = Some(Arc::clone(&resolver));

        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (incoming, accept) = tls::incoming(listener, resolver, client_auth)?;
        let cosi = cosi::Cosi {
            resources: Arc::new(hardware::maintenance_resources(
                &self.identity.hardware,
                &self.identity.talos_version,
            )),
        };
        let talos_version = self.identity.talos_version.clone();
        let router =
            match &self.mode {
                Mode::Maintenance | Mode::WorkerWaiting => Server::builder().add_service(
                    MachineServiceServer::new(maintenance::Maintenance {
                        talos_version,
                        node: this,
                    }),
                ),
                Mode::Configured(_) => Server::builder().add_service(MachineServiceServer::new(
                    configured::Configured { talos_version },
                )),
            }
            .add_service(StateServer::new(cosi));
        let handle = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        }));
        self.server = Some((stop_tx, handle, accept));
        Ok(())
    }

    async fn shut_down(&mut self) {
        if let Some((stop, handle, accept)) = self.server.take() {
            accept.abort();
            let _ = accept.await;
            let _ = stop.send(());
            let _ = handle.await;
        }
    }

    /// Applies a config received in maintenance mode: the node installs if the config says so,
    /// and comes back configured (control planes) or waiting for trustd (workers).
    pub(crate) async fn apply(
        &mut self,
        this: std::sync::Weak<Mutex<Node>>,
        config: AppliedConfig,
    ) {
        self.shut_down().await;
        self.installed = config.install;
        self.mode = if config.machine_type == "controlplane" {
            Mode::Configured(config)
        } else {
            Mode::WorkerWaiting
        };
        if let Err(error) = self.boot(this).await {
            tracing::warn!(%error, "simulated node failed to boot with its config");
        }
    }

    fn inject(&mut self, fault: Fault) -> Result<String, SimError> {
        let resolver = self
            .resolver
            .as_ref()
            .ok_or_else(|| SimError::TlsSetup("the node is not running".into()))?;
        match fault {
            Fault::DifferentCertificate => {
                let other = tls::boot_certificate()?;
                resolver.set(other.certified);
                Ok(other.fingerprint)
            }
            Fault::MismatchedKey => {
                let der = self
                    .certificate
                    .as_ref()
                    .ok_or_else(|| SimError::TlsSetup("no boot certificate".into()))?;
                resolver.set(tls::Resolver::mismatched(der)?);
                Ok(self
                    .fingerprint
                    .lock()
                    .map(|f| f.clone())
                    .unwrap_or_default())
            }
        }
    }
}
