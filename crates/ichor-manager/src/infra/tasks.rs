//! The manager's long-running work, watched (ADR 0049): each controller and each background
//! watch runs as a task of one [`Tasks`] set. A task that ends while the manager is not
//! stopping (its stream ended, it returned, it panicked) is logged at error level and recorded
//! in [`Health`]: `/healthz` then fails naming it, and Kubernetes restarts the manager. A
//! controller that died silently would otherwise leave a process that looks well and does
//! nothing for anyone.
//!
//! Dropping the set aborts every task: a lost Lease drops the controllers at once.
//!
//! Not here: a panic inside one reconcile, which never ends its controller
//! (`crate::infra::panics`).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Arc;

use ichor_service::Health;
use tokio::sync::watch;
use tokio::task::{Id, JoinError, JoinSet};

/// The manager's long-running tasks, each with its name (`controller machine`).
#[derive(Debug)]
pub struct Tasks {
    set: JoinSet<()>,
    names: HashMap<Id, String>,
    health: Arc<Health>,
    stopping: watch::Receiver<bool>,
}

impl Tasks {
    /// An empty set recording into `health`; a task that ends once `stopping` holds true ended
    /// as asked.
    pub fn new(health: Arc<Health>, stopping: watch::Receiver<bool>) -> Self {
        Self {
            set: JoinSet::new(),
            names: HashMap::new(),
            health,
            stopping,
        }
    }

    /// Runs `work` as the task `name`, meant to run until the manager stops.
    pub fn spawn(
        &mut self,
        name: impl Into<String>,
        work: impl Future<Output = ()> + Send + 'static,
    ) {
        let handle = self.set.spawn(work);
        self.names.insert(handle.id(), name.into());
    }

    /// Waits until every task ended; records each that ended while the manager was not
    /// stopping, the others go on meanwhile.
    pub async fn watch(mut self) {
        while let Some(ended) = self.set.join_next_with_id().await {
            let (id, how) = match ended {
                Ok((id, ())) => (id, "returned".to_owned()),
                Err(error) => (error.id(), how(error)),
            };
            let name = self.names.remove(&id).unwrap_or_else(|| "a task".into());
            if *self.stopping.borrow() {
                tracing::debug!(task = %name, %how, "stopped with the manager");
                continue;
            }
            tracing::error!(
                task = %name,
                %how,
                "stopped while the manager runs: /healthz fails until the manager is restarted"
            );
            self.health.stopped(format!("{name} {how}"));
        }
    }
}

/// How a task that did not return ended.
fn how(error: JoinError) -> String {
    if error.is_panic() {
        format!(
            "panicked ({})",
            crate::infra::panics::summary(&*error.into_panic())
        )
    } else {
        "was cancelled".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_task_that_panics_or_returns_fails_health_naming_it() {
        let health = Arc::new(Health::default());
        let (_stop, stopping) = watch::channel(false);
        let mut tasks = Tasks::new(Arc::clone(&health), stopping);
        let (release, held) = tokio::sync::oneshot::channel::<()>();
        tasks.spawn("controller machine", async {
            panic!("overflow");
        });
        tasks.spawn("controller cluster", async {});
        tasks.spawn("controller operation", async {
            let _ = held.await;
        });
        let watching = tokio::spawn(tasks.watch());
        // The two that ended are recorded while the third still runs.
        tokio::time::timeout(std::time::Duration::from_secs(10), async {
            while health.failures().len() < 2 {
                tokio::task::yield_now().await;
            }
        })
        .await
        .expect("both recorded");
        let mut failures = health.failures();
        failures.sort();
        assert_eq!(
            failures,
            [
                "controller cluster returned",
                "controller machine panicked (overflow)"
            ]
        );
        assert!(!watching.is_finished(), "the others still run");
        let _ = release.send(());
        watching.await.expect("watched");
        assert_eq!(health.failures().len(), 3);
    }

    #[tokio::test]
    async fn tasks_that_end_with_the_manager_leave_health_alone() {
        let health = Arc::new(Health::default());
        let (stop, stopping) = watch::channel(false);
        let mut tasks = Tasks::new(Arc::clone(&health), stopping.clone());
        let mut asked = stopping;
        tasks.spawn("controller machine", async move {
            let _ = asked.wait_for(|s| *s).await;
        });
        let watching = tokio::spawn(tasks.watch());
        stop.send(true).expect("sent");
        watching.await.expect("watched");
        assert!(health.failures().is_empty(), "{:?}", health.failures());
    }
}
