//! The validating admission webhook: refuses unsafe TalosMachine and TalosCluster deletes and
//! updates at the door by applying `ichor-deleteguard` to live state, serializes concurrent
//! control-plane deletes with a reservation on the TalosCluster, and manages its own CA and
//! serving certificates. Given the apiserver's client CA, it answers only a caller that
//! presents a certificate of it; it reserves a removal only for the live object (ADR 0051).
#![forbid(unsafe_code)]

pub mod certs;
pub mod client_auth;
pub mod guard;
pub mod metrics;
pub mod server;
#[cfg(test)]
mod tuning;

pub use certs::CertSettings;
pub use client_auth::ClientAuth;
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
    /// The client CA could not be used.
    #[error(transparent)]
    ClientAuth(#[from] client_auth::ClientAuthError),
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
