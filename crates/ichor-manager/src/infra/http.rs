//! `/metrics`, `/healthz` and `/readyz`, served by `ichor_service::serve`. Every replica that
//! runs is ready, leader or standby: readiness says the process works, not that it leads
//! (`ichor_leader` says that).

use std::net::SocketAddr;
use std::sync::Arc;

pub use ichor_service::Health;

use crate::Metrics;

/// Serves the endpoints on `addr` (port 0 picks one); returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<SocketAddr> {
    ichor_service::serve(addr, metrics.registry(), health).await
}
