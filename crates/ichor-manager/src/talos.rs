//! Reaching a node's Talos API: a configured node over mutual TLS, a node in maintenance mode
//! by its probe.

use ichor_talos::discovery::SweepConfig;
use ichor_talos::{Credentials, TalosClient};

/// A mutual-TLS connection to a configured node.
pub async fn connect(address: &str, credentials: &Credentials) -> Option<TalosClient> {
    TalosClient::connect(address, credentials).await.ok()
}

/// Whether the node at `address` (`ip` or `ip:port`) answers in maintenance mode; its
/// fingerprint if so (a reset node is back there with a new one).
pub async fn in_maintenance(address: &str, sweep: SweepConfig) -> Option<String> {
    let socket = address.parse::<std::net::SocketAddr>().ok().or_else(|| {
        address
            .parse::<std::net::IpAddr>()
            .ok()
            .map(|ip| std::net::SocketAddr::new(ip, sweep.port))
    })?;
    let std::net::IpAddr::V4(ip) = socket.ip() else {
        return None;
    };
    let config = SweepConfig {
        port: socket.port(),
        ..sweep
    };
    match ichor_talos::discovery::probe(ip, config).await? {
        ichor_talos::discovery::ProbeOutcome::Maintenance(found) => Some(found.fingerprint),
        _ => None,
    }
}
