//! Shared by the manager's tests: a private control plane with the CRDs and a namespace, the
//! manager running in process against it, and its reconcile counts.

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
    let (stop_tx, manager, _) = start_manager_with_metrics(env);
    (stop_tx, manager)
}

/// [`start_manager`], also returning the manager's metrics: the reconcile counts prove the
/// manager had its chance to act before a test asserts something did not happen.
pub fn start_manager_with_metrics(
    env: &TestEnv,
) -> (
    tokio::sync::oneshot::Sender<()>,
    tokio::task::JoinHandle<()>,
    Arc<Metrics>,
) {
    let settings = Settings {
        sweep: SweepConfig {
            timeout: Duration::from_millis(500),
            ..SweepConfig::default()
        },
        progress_requeue: Duration::from_millis(300),
        ..Settings::default()
    };
    let metrics = Arc::new(Metrics::default());
    let ctx = Arc::new(Context::new(env.client(), settings, Arc::clone(&metrics)));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(ichor_manager::run(ctx, async {
        let _ = stop_rx.await;
    }));
    (stop_tx, manager, metrics)
}

/// How many reconciles of `kind` (e.g. `TalosMachine`) `metrics` counted.
pub fn reconciles(metrics: &Metrics, kind: &str) -> u64 {
    let series = format!("ichor_reconciles_total{{kind=\"{kind}\"}}");
    metrics
        .render()
        .lines()
        .find_map(|line| line.strip_prefix(series.as_str()))
        .and_then(|value| value.trim().parse::<f64>().ok())
        .map_or(0, |value| value as u64)
}

/// An approved control plane `cp-1` of cluster `lab` in `ns`, at `address`: the machine most
/// tests start from (add its fingerprint or UUID label, then [`create_machine`]).
pub fn lab_control_plane(ns: &str, address: &str) -> ichor_api::testing::MachineBuilder {
    ichor_api::TalosMachine::test("cp-1")
        .namespace(ns)
        .cluster("lab")
        .control_plane()
        .approved()
        .at(address)
}

/// Creates `machine` in `ns`.
pub async fn create_machine(
    env: &TestEnv,
    ns: &str,
    machine: ichor_api::testing::MachineBuilder,
) -> ichor_api::TalosMachine {
    kube::Api::<ichor_api::TalosMachine>::namespaced(env.client(), ns)
        .create(&kube::api::PostParams::default(), &machine.build())
        .await
        .expect("the machine")
}
