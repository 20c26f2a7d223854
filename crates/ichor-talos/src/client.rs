//! Connections to a Talos node and the typed operations on them.

use std::sync::Arc;
use std::time::Duration;

use tonic::transport::{Channel, ClientTlsConfig, Endpoint};

use crate::api::machine::machine_service_client::MachineServiceClient;
use crate::tls::PinningVerifier;

/// How long a TCP connect plus TLS handshake may take.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// What went wrong talking to a node.
#[derive(Debug, thiserror::Error)]
pub enum TalosError {
    /// The node presented a certificate other than the pinned one.
    #[error("{endpoint} presented certificate fingerprint {observed}, not the pinned {pinned}")]
    FingerprintMismatch {
        /// The node's address.
        endpoint: String,
        /// The pinned fingerprint.
        pinned: String,
        /// The fingerprint the node presented.
        observed: String,
    },
    /// The endpoint is not a valid address.
    #[error("invalid endpoint {endpoint}")]
    InvalidEndpoint {
        /// The address given.
        endpoint: String,
        /// The parse error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The connection could not be made.
    #[error("cannot connect to {endpoint}")]
    Connect {
        /// The node's address.
        endpoint: String,
        /// The transport error.
        #[source]
        source: tonic::transport::Error,
    },
    /// An RPC failed.
    #[error("{method} on {endpoint} failed: {status}")]
    Rpc {
        /// The RPC.
        method: &'static str,
        /// The node's address.
        endpoint: String,
        /// The gRPC status.
        status: tonic::Status,
    },
    /// The node answered, but its reply carried an error (a wrapped per-node error).
    #[error("{method} on {endpoint}: the node reported: {message}")]
    Node {
        /// The RPC.
        method: &'static str,
        /// The node's address.
        endpoint: String,
        /// The node's error.
        message: String,
    },
}

/// A connection to one Talos node.
#[derive(Debug, Clone)]
pub struct TalosClient {
    endpoint: String,
    channel: Channel,
}

fn url(endpoint: &str) -> String {
    if endpoint.contains(':')
        && !endpoint.starts_with('[')
        && endpoint.parse::<std::net::Ipv6Addr>().is_err()
    {
        format!("https://{endpoint}")
    } else {
        format!("https://{endpoint}:{}", crate::TALOS_API_PORT)
    }
}

impl TalosClient {
    /// Connects to a node in maintenance mode (`host` or `host:port`), trusting only the
    /// certificate whose fingerprint is `pinned`. A different certificate is refused with
    /// [`TalosError::FingerprintMismatch`] carrying the observed fingerprint.
    pub async fn connect_maintenance(endpoint: &str, pinned: &str) -> Result<Self, TalosError> {
        let verifier = PinningVerifier::new(pinned);
        let observed = verifier.observed();
        let tls = ClientTlsConfig::new().domain_name("talos");
        let channel_endpoint = Endpoint::from_shared(url(endpoint))
            .map_err(|source| TalosError::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?
            .connect_timeout(CONNECT_TIMEOUT)
            .tls_config_with_verifier(tls, Arc::new(verifier))
            .map_err(|source| TalosError::InvalidEndpoint {
                endpoint: endpoint.to_owned(),
                source,
            })?;
        match channel_endpoint.connect().await {
            Ok(channel) => Ok(Self {
                endpoint: endpoint.to_owned(),
                channel,
            }),
            Err(source) => {
                let seen = observed.lock().ok().and_then(|o| o.clone());
                match seen {
                    Some(observed) if observed != pinned => Err(TalosError::FingerprintMismatch {
                        endpoint: endpoint.to_owned(),
                        pinned: pinned.to_owned(),
                        observed,
                    }),
                    _ => Err(TalosError::Connect {
                        endpoint: endpoint.to_owned(),
                        source,
                    }),
                }
            }
        }
    }

    /// The underlying channel, for calls without a typed wrapper yet.
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// The node's address.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The Talos version the node runs (`VersionInfo.tag`, e.g. `v1.14.1`).
    pub async fn version(&self) -> Result<String, TalosError> {
        const METHOD: &str = "Version";
        let reply = MachineServiceClient::new(self.channel.clone())
            .version(())
            .await
            .map_err(|status| TalosError::Rpc {
                method: METHOD,
                endpoint: self.endpoint.clone(),
                status,
            })?
            .into_inner();
        let first = reply
            .messages
            .into_iter()
            .next()
            .ok_or_else(|| TalosError::Node {
                method: METHOD,
                endpoint: self.endpoint.clone(),
                message: "empty reply".into(),
            })?;
        if let Some(error) = first
            .metadata
            .as_ref()
            .map(|m| m.error.clone())
            .filter(|e| !e.is_empty())
        {
            return Err(TalosError::Node {
                method: METHOD,
                endpoint: self.endpoint.clone(),
                message: error,
            });
        }
        Ok(first.version.map(|v| v.tag).unwrap_or_default())
    }
}
