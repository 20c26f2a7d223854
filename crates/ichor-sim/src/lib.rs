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

use std::net::SocketAddr;
use std::sync::Arc;

use ichor_talos::api::cosi::resource::state_server::StateServer;
use ichor_talos::api::machine::machine_service_server::MachineServiceServer;
use rcgen::{CertificateParams, KeyPair, PKCS_ED25519};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tonic::transport::{Identity, Server, ServerTlsConfig};

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
    #[error("cannot configure TLS")]
    Tls(#[from] tonic::transport::Error),
}

/// The node's identity that survives reboots.
#[derive(Debug, Clone)]
struct NodeIdentity {
    talos_version: String,
    hardware: Hardware,
}

/// A running server: how to stop it, and its task.
type Running = (
    oneshot::Sender<()>,
    JoinHandle<Result<(), tonic::transport::Error>>,
);

/// A simulated node in maintenance mode, serving on its address until stopped.
#[derive(Debug)]
pub struct SimNode {
    addr: SocketAddr,
    identity: Arc<NodeIdentity>,
    fingerprint: String,
    server: Option<Running>,
}

/// A fresh self-signed Ed25519 certificate: Talos generates its maintenance certificate in
/// memory on every boot (talos-facts §2 "Maintenance mode", §8.2).
fn boot_certificate() -> Result<(String, String, String), SimError> {
    let key = KeyPair::generate_for(&PKCS_ED25519)?;
    let cert = CertificateParams::new(vec!["talos".to_owned()])?.self_signed(&key)?;
    let fingerprint = ichor_render::pki::fingerprint_der(cert.der())
        .expect("a certificate rcgen just made parses");
    Ok((cert.pem(), key.serialize_pem(), fingerprint))
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
            server: None,
        };
        node.boot().await?;
        Ok(node)
    }

    async fn boot(&mut self) -> Result<(), SimError> {
        let (cert, key, fingerprint) = boot_certificate()?;
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
        self.fingerprint = fingerprint;
        let service = maintenance::Maintenance {
            talos_version: self.identity.talos_version.clone(),
        };
        // No client CA: maintenance mode neither requests nor verifies client certificates.
        let tls = ServerTlsConfig::new().identity(Identity::from_pem(cert, key));
        let (stop_tx, stop_rx) = oneshot::channel::<()>();
        let incoming = tonic::transport::server::TcpIncoming::from(listener);
        let cosi = cosi::Cosi {
            resources: Arc::new(hardware::maintenance_resources(
                &self.identity.hardware,
                &self.identity.talos_version,
            )),
        };
        let router = Server::builder()
            .tls_config(tls)?
            .add_service(MachineServiceServer::new(service))
            .add_service(StateServer::new(cosi));
        let handle = tokio::spawn(router.serve_with_incoming_shutdown(incoming, async {
            let _ = stop_rx.await;
        }));
        self.server = Some((stop_tx, handle));
        Ok(())
    }

    async fn shut_down(&mut self) {
        if let Some((stop, handle)) = self.server.take() {
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
