//! The setup Ichor's long-running binaries (`ichor-manager`, `ichor-webhook`) share, so that
//! both behave alike: JSON logs filtered by `RUST_LOG` ([`init_tracing`]), the Kubernetes
//! client, in-cluster or from `KUBECONFIG` ([`client`]), graceful stop on SIGTERM or Ctrl-C
//! ([`terminated`]), fixed exit codes ([`exit`]: 0 clean, 1 runtime failure, 2 usage — clap
//! exits with 2 by itself), and the plain-HTTP endpoint with `/metrics`, `/healthz` and
//! `/readyz` ([`serve`]).
//!
//! What does not live here: flags (each binary declares its own with clap), the metrics
//! themselves (each crate registers its own in a [`Registry`]) and any reconcile or admission
//! logic.
#![forbid(unsafe_code)]

use std::fmt::Display;
use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::extract::State;
use axum::http::{StatusCode, header};
use axum::response::IntoResponse;
use axum::routing::get;
pub use prometheus_client::registry::Registry;

/// The exit code of a usage error (bad flags), as clap uses it.
pub const USAGE: u8 = 2;

/// A clap value parser for settings that must be a positive whole number (seconds, counts).
pub fn positive(text: &str) -> Result<u64, String> {
    text.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| "expected a positive whole number".to_owned())
}

/// Installs the JSON log subscriber, filtered by `RUST_LOG` (default `info`).
pub fn init_tracing() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    // A second call (tests starting two services in one process) keeps the first subscriber.
    let _ = tracing_subscriber::fmt()
        .json()
        .with_env_filter(filter)
        .try_init();
}

/// The Kubernetes client: the in-cluster configuration, or `KUBECONFIG`.
pub async fn client() -> Result<kube::Client, kube::Error> {
    kube::Client::try_default().await
}

/// Resolves on SIGTERM or Ctrl-C (only Ctrl-C when SIGTERM cannot be watched).
pub async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    } else {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The exit code for a service's outcome: 0 when it stopped cleanly, 1 (after printing
/// `name: error` on stderr and logging it) when it failed at run time.
pub fn exit<E: Display>(name: &str, outcome: Result<(), E>) -> ExitCode {
    match outcome {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!(%error, "{name} stopped");
            eprintln!("{name}: {error}");
            ExitCode::FAILURE
        }
    }
}

/// What `/readyz` and `/healthz` report: ready once the binary says so; healthy until a part
/// of it that must run as long as the process (a controller) stops.
#[derive(Debug, Default)]
pub struct Health {
    /// Whether this process is ready (for the manager: running, leader or standby).
    pub ready: AtomicBool,
    /// The parts that stopped, each with how (`controller machine panicked`).
    stopped: Mutex<Vec<String>>,
}

impl Health {
    /// Marks the process ready or not.
    pub fn set_ready(&self, ready: bool) {
        self.ready.store(ready, Ordering::SeqCst);
    }

    /// Whether the process is ready.
    pub fn is_ready(&self) -> bool {
        self.ready.load(Ordering::SeqCst)
    }

    /// Records that `what` stopped while the process runs (e.g. `controller machine
    /// panicked`): `/healthz` fails from then on, naming it, so that the process is restarted.
    pub fn stopped(&self, what: impl Into<String>) {
        self.stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push(what.into());
    }

    /// What stopped, in the order it stopped; empty while the process is healthy.
    pub fn failures(&self) -> Vec<String> {
        self.stopped
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }
}

#[derive(Clone)]
struct Endpoint {
    registry: Arc<Registry>,
    health: Arc<Health>,
}

/// The Prometheus text exposition of everything in `registry`.
pub fn render(registry: &Registry) -> String {
    let mut text = String::new();
    if let Err(error) = prometheus_client::encoding::prometheus_text::encode(&mut text, registry) {
        tracing::error!(%error, "cannot encode the metrics");
    }
    text
}

async fn metrics(State(endpoint): State<Endpoint>) -> impl IntoResponse {
    (
        [(
            header::CONTENT_TYPE,
            prometheus_client::encoding::prometheus_text::CONTENT_TYPE,
        )],
        render(&endpoint.registry),
    )
}

async fn readyz(State(endpoint): State<Endpoint>) -> (StatusCode, &'static str) {
    if endpoint.health.is_ready() {
        (StatusCode::OK, "ok")
    } else {
        (StatusCode::SERVICE_UNAVAILABLE, "starting")
    }
}

async fn healthz(State(endpoint): State<Endpoint>) -> (StatusCode, String) {
    let failures = endpoint.health.failures();
    if failures.is_empty() {
        (StatusCode::OK, "ok".to_owned())
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("stopped: {}", failures.join("; ")),
        )
    }
}

/// Serves `/metrics` (the registry, Prometheus text format), `/healthz` (ok until `health`
/// records a stopped part, then 503 naming it) and `/readyz` (`health`'s readiness) over plain
/// HTTP on `addr` (port 0 picks one); returns the bound address.
pub async fn serve(
    addr: SocketAddr,
    registry: Arc<Registry>,
    health: Arc<Health>,
) -> std::io::Result<SocketAddr> {
    let app = axum::Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Endpoint { registry, health });
    let listener = tokio::net::TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    tokio::spawn(async move {
        if let Err(error) = axum::serve(listener, app).await {
            tracing::error!(%error, "the metrics endpoint failed");
        }
    });
    Ok(bound)
}

#[cfg(test)]
mod tests {
    use super::*;
    use prometheus_client::metrics::counter::Counter;

    #[test]
    fn renders_registered_metrics_in_the_prometheus_text_format() {
        let mut registry = Registry::default();
        let counter: Counter = Counter::default();
        registry.register("ichor_things", "Things.", counter.clone());
        counter.inc_by(3);
        let text = render(&registry);
        let lines = text.lines().map(|l| Ok(l.to_owned()));
        let scrape = prometheus_parse::Scrape::parse(lines).expect("parses");
        let sample = scrape
            .samples
            .iter()
            .find(|s| s.metric == "ichor_things_total")
            .unwrap_or_else(|| panic!("no ichor_things_total in {text}"));
        assert_eq!(sample.value, prometheus_parse::Value::Counter(3.0));
    }

    #[tokio::test]
    async fn healthz_fails_naming_what_stopped() {
        let health = Arc::new(Health::default());
        let endpoint = Endpoint {
            registry: Arc::new(Registry::default()),
            health: Arc::clone(&health),
        };
        let (code, body) = healthz(State(endpoint.clone())).await;
        assert_eq!((code, body.as_str()), (StatusCode::OK, "ok"));
        health.stopped("controller machine panicked");
        let (code, body) = healthz(State(endpoint)).await;
        assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
        assert!(body.contains("controller machine panicked"), "{body}");
    }

    #[test]
    fn positive_settings_refuse_zero_and_words() {
        assert_eq!(positive("15"), Ok(15));
        assert!(positive("0").is_err());
        assert!(positive("-1").is_err());
        assert!(positive("soon").is_err());
    }

    #[test]
    fn exit_codes_say_clean_or_failed() {
        assert_eq!(exit::<String>("x", Ok(())), ExitCode::SUCCESS);
        assert_eq!(exit("x", Err("boom")), ExitCode::FAILURE);
    }
}
