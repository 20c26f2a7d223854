//! `/metrics`, `/healthz` and `/readyz` (ready once this replica leads and runs its
//! controllers, or is a healthy standby).

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use axum::extract::State;
use axum::http::StatusCode;
use axum::routing::get;

use crate::Metrics;

/// What the probes report.
#[derive(Debug, Default)]
pub struct Health {
    /// Whether the controllers (or the standby loop) run.
    pub ready: AtomicBool,
    /// Whether this replica leads.
    pub leading: AtomicBool,
}

#[derive(Clone)]
struct AppState {
    metrics: Arc<Metrics>,
    health: Arc<Health>,
}

async fn render_metrics(State(state): State<AppState>) -> String {
    let mut text = state.metrics.render();
    text.push_str(&format!(
        "# HELP ichor_leader Whether this replica leads.\n# TYPE ichor_leader gauge\nichor_leader {}\n",
        u8::from(state.health.leading.load(Ordering::SeqCst))
    ));
    text
}

async fn readyz(State(state): State<AppState>) -> (StatusCode, &'static str) {
    if state.health.ready.load(Ordering::SeqCst) {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

/// Serves the endpoints on `addr`; returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    metrics: Arc<Metrics>,
    health: Arc<Health>,
) -> std::io::Result<SocketAddr> {
    let app = axum::Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(AppState { metrics, health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics endpoint failed");
        }
    });
    Ok(bound)
}
