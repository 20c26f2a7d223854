//! Shared by the manager's tests: a private control plane with the CRDs and a namespace, the
//! manager running in process against it, and a poll helper.

#![allow(dead_code)]

use std::sync::Arc;
use std::time::Duration;

use ichor_manager::{Context, Metrics, Settings};
use ichor_talos::discovery::SweepConfig;
use ichor_testenv::TestEnv;

/// A private control plane with Ichor's CRDs, and a fresh namespace.
pub async fn plane(prefix: &str) -> (TestEnv, String) {
    let env = TestEnv::private().await.expect("private control plane");
    env.install_crds(ichor_api::crds()).await.expect("CRDs");
    let ns = env.namespace(prefix).await.expect("namespace");
    (env, ns)
}

/// The manager's controllers, running until the returned sender is dropped or fired.
pub fn start_manager(
    env: &TestEnv,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
) {
    let settings = Settings {
        sweep: SweepConfig {
            timeout: Duration::from_millis(500),
            ..SweepConfig::default()
        },
        progress_requeue: Duration::from_millis(300),
        ..Settings::default()
    };
    let ctx = Arc::new(Context::new(
        env.client(),
        settings,
        Arc::new(Metrics::default()),
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(ichor_manager::run(ctx, async {
        let _ = stop_rx.await;
    }));
    (stop_tx, manager)
}

/// Polls `check` every 200 ms until it holds, for up to `limit`.
pub async fn eventually<F, Fut>(what: &str, limit: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let deadline = std::time::Instant::now() + limit;
    while !check().await {
        assert!(
            std::time::Instant::now() < deadline,
            "timed out waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}
