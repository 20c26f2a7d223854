//! The manager: five controllers that take machines booted into Talos maintenance mode to a
//! Ready cluster and keep it so. Each reconcile observes, decides (pure functions, unit-tested)
//! and acts; nothing is written to a machine nobody approved.
//!
//! # Layout
//!
//! - Code used by one controller lives in `controller/<kind>/`: `mod.rs` is its wiring (what it
//!   watches, `run_controller`) and its reconcile, read top to bottom; `observe.rs` only reads
//!   and returns what it saw; `plan.rs` decides, synchronously, and carries the unit tests;
//!   `act.rs` performs one action and records it, deciding nothing. A flow with recorded steps
//!   (drift, removal, restore, adoption, teardown), or a part of a look that is a failure
//!   domain of its own (a machine's BMC), is a folder of the same shape.
//! - Code shared by controllers lives at the crate root, named for what it acts on (the
//!   cluster [`lock`], the bundle's [`secrets`], a machine's [`claims`], the
//!   [`backup_store`]), beside the [`Settings`] and the [`Context`] every reconcile shares;
//!   plumbing that knows nothing of Talos lives in [`infra`].
//!
//! # Glossary
//!
//! - **look**: one reconcile of a machine: it observes the node and records what it saw.
//! - **settled**: a machine with nothing in progress, looked at again at the settled pace
//!   (`Settings::settled_requeue`, [`Settings::settled_looks_per_second`] fleet-wide).
//! - **echo**: a reconcile caused only by the object's own last status write; it waits for
//!   its due look instead of observing again (ADR 0034).
//! - **standing**: where a machine stands as its status says (phase and conditions); a machine
//!   that stands still is looked at less often.
//! - **stop**: why a reconcile stopped short, as the user sees it: one [`Stop`], a reason and a
//!   message, set on a condition and published as an Event in one place; never an [`Error`],
//!   which the error policy retries.
#![forbid(unsafe_code)]
// Reconcilers observe, plan (pure functions) and act; a function much past 60 lines
// (clippy.toml) mixes them.
#![warn(clippy::too_many_lines)]

pub mod accepted;
pub mod backup_store;
pub mod claims;
mod context;
pub mod controller;
pub mod drain;
pub mod drift;
pub mod error;
pub mod etcd;
pub mod factory;
pub mod identity;
pub mod infra;
pub mod kubernetes_steps;
pub mod layers;
#[cfg(test)]
mod layout;
pub mod lock;
pub mod node_deletes;
pub mod renewal;
pub mod rollout_policy;
pub mod safety;
pub mod secrets;
mod settings;
pub mod stop;
mod talos;
#[cfg(test)]
mod tuning;
pub mod workload;

use std::sync::Arc;

use controller::{backup, cluster, machine, operation, storage};
use ichor_api::names::controllers;
use infra::{drive, tasks};

pub use context::{CLUSTER_REF_FIELD, Context, cluster_machines, cluster_machines_as_stored};
pub use error::{Category, Error};
pub use infra::clock::{Clock, SystemClock, TestClock};
pub use infra::metrics::Metrics;
pub use settings::{
    DEFAULT_CONCURRENCY, DEFAULT_INSTALL_STALL_LIMIT, DEFAULT_SETTLED_LOOKS_PER_SECOND, Settings,
};
pub use stop::Stop;
pub use talos::{connect, in_maintenance};

/// Runs the controllers until `shutdown` resolves, each (and each background watch) as a task
/// of its own: one that stops before is logged and fails `ctx.health` (`tasks`); the others
/// go on. Talos API calls made meanwhile are timed into `ctx.metrics` (the process-wide
/// observer of `ichor_talos::client::observe`, installed by the first `run`).
pub async fn run(
    ctx: Arc<Context>,
    shutdown: impl std::future::Future<Output = ()> + Send + Sync + 'static,
) {
    let metrics = Arc::clone(&ctx.metrics);
    ichor_talos::client::observe(Arc::new(move |rpc| metrics.talos_rpc(rpc)));
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        shutdown.await;
        let _ = stop_tx.send(true);
    });
    let mut tasks = tasks::Tasks::new(Arc::clone(&ctx.health), stop_rx.clone());
    for (name, watch) in ctx
        .shared_watches()
        .into_iter()
        .chain(ctx.layers.watches(&ctx.client))
    {
        tasks.spawn(name, drive::until_stopped(watch, stop_rx.clone()));
    }
    let named = |controller: &str| format!("controller {controller}");
    tasks.spawn(
        named(controllers::CLUSTER),
        cluster::run_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::MACHINE),
        machine::run_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::STORAGE),
        storage::run_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::BACKUP),
        backup::run_controller(Arc::clone(&ctx), stop_rx.clone()),
    );
    tasks.spawn(
        named(controllers::OPERATION),
        operation::run_controller(ctx, stop_rx),
    );
    tasks.watch().await;
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    #[tokio::test]
    async fn a_manager_told_to_stop_before_its_caches_filled_stops() {
        // Nothing answers: no controller's cache ever fills.
        let ctx = Arc::new(Context::nowhere(Settings::default()));
        let health = Arc::clone(&ctx.health);
        tokio::time::timeout(Duration::from_secs(30), run(ctx, async {}))
            .await
            .expect("every controller ended");
        assert!(health.failures().is_empty(), "{:?}", health.failures());
    }
}
