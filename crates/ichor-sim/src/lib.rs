//! A Talos node simulator speaking the same gRPC API as real nodes, for tests and the local
//! demo. Every behaviour follows `talos-facts.md`; each cites the fact it models.
//!
//! So far: a node in **maintenance mode** (talos-facts §2): a self-signed Ed25519 certificate
//! regenerated on every boot, no client certificates, every caller `os:reader`; `Version`
//! answers; methods that need `os:operator` or `os:admin` are refused; etcd reads answer as on a
//! machine whose type is not set (§1.2). Configuration, install, mTLS, etcd membership, faults
//! and gates come next.
#![forbid(unsafe_code)]

mod cosi;
pub mod hardware;
mod maintenance;
mod tls;

use std::net::SocketAddr;
use std::sync::Arc;

use ichor_talos::api::cosi::resource::state_server::StateServer;
use ichor_talos::api::machine::machine_service_server::MachineServiceServer;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::Server;

pub use hardware::{Hardware, SimDisk, SimLink};

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
}

/// The node's identity that survives reboots.
#[derive(Debug, Clone)]
struct NodeIdentity {
    talos_version: String,
    hardware: Hardware,
}

/// A running server: how to stop it, its task, and the task accepting its connections.
type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
    JoinHandle<()>,
);

/// A simulated node in maintenance mode, serving on its address until stopped.
#[derive(Debug)]
pub struct SimNode {
    addr: SocketAddr,
    identity: Arc<NodeIdentity>,
    fingerprint: String,
    certificate: Option<rustls::pki_types::CertificateDer<'static>>,
    resolver: Option<Arc<tls::Resolver>>,
    server: Option<Running>,
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
        let mut node = Self {
            addr,
            identity: Arc::new(NodeIdentity {
                talos_version: talos_version.to_owned(),
                hardware,
            }),
            fingerprint: String::new(),
            certificate: None,
            resolver: None,
            server: None,
        };
        node.boot().await?;
        Ok(node)
    }

    async fn boot(&mut self) -> Result<(), SimError> {
        let boot = tls::boot_certificate()?;
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
        self.fingerprint = boot.fingerprint;
        self.certificate = Some(boot.der);
        let resolver = Arc::new(tls::Resolver::new(boot.certified));
        self.resolver = Some(Arc::clone(&resolver));
        let service = maintenance::Maintenance {
            talos_version: self.identity.talos_version.clone(),
        };
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let (incoming, accept) = tls::incoming(listener, resolver);
        let cosi = cosi::Cosi {
            resources: Arc::new(hardware::maintenance_resources(
                &self.identity.hardware,
                &self.identity.talos_version,
            )),
        };
        let router = Server::builder()
            .add_service(MachineServiceServer::new(service))
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

    /// Reboots the node: it goes away and comes back on the same address with a new
    /// certificate, so its fingerprint changes (talos-facts §8.2).
    pub async fn reboot(&mut self) -> Result<(), SimError> {
        self.shut_down().await;
        self.boot().await
    }

    /// Injects a fault into the running node. Returns the fingerprint the node now presents.
    pub fn inject(&mut self, fault: Fault) -> Result<String, SimError> {
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
                Ok(self.fingerprint.clone())
            }
        }
    }

    /// Stops the node.
    pub async fn stop(mut self) {
        self.shut_down().await;
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
    pub fn fingerprint(&self) -> &str {
        &self.fingerprint
    }
}
