//! The validating admission webhook: refuses unsafe TalosMachine and TalosCluster deletes and
//! updates at the door by applying `ichor-deleteguard` to live state, serializes concurrent
//! control-plane deletes with a reservation on the TalosCluster, and manages its own CA and
//! serving certificates.
#![forbid(unsafe_code)]

pub mod certs;
pub mod guard;
pub mod metrics;
pub mod server;

pub use certs::CertSettings;
pub use guard::{Decision, Guard};
pub use metrics::Metrics;
pub use server::{Running, Settings, start};

pub use ichor_api::admission::{
    WEBHOOK_CERT_SECRET as CERT_SECRET, WEBHOOK_CONFIGURATION, WEBHOOK_PATH,
};

/// What can stop the webhook.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    /// Certificates could not be set up.
    #[error(transparent)]
    Certs(#[from] certs::CertError),
    /// TLS could not be configured.
    #[error("cannot configure TLS: {0}")]
    Tls(String),
    /// The listener could not be bound.
    #[error("cannot listen on {0}")]
    Bind(std::net::SocketAddr),
    /// Serving failed.
    #[error("serving failed: {0}")]
    Serve(#[source] std::io::Error),
}
