//! A manager replica of the sim target, run as a Deployment runs its pod (ADR 0044): a
//! replica that exits because it lost its Lease is started again under the same identity (the
//! kubelet restarts the container, and the pod keeps its name), and the restart is recorded.
//! Any other exit is not: a crash stays visible to the spec. A replica a spec kills
//! ([`Replica::kill`]) stays dead, as a deleted pod does until a spec starts another.

use std::path::PathBuf;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use tokio::process::Child;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::Error;
use crate::sim::{LOG_LINES, LogTail, spawn_drained};

/// How to start one replica: the same command at every (re)start.
#[derive(Debug, Clone)]
pub(crate) struct Launch {
    /// The `ichor-manager` binary.
    pub(crate) binary: PathBuf,
    /// Its arguments (its `--identity` among them).
    pub(crate) args: Vec<String>,
    /// The kubeconfig it runs with.
    pub(crate) kubeconfig: PathBuf,
    /// Where its last lines are kept.
    pub(crate) log: LogTail,
    /// The file holding its whole log.
    pub(crate) log_file: PathBuf,
}

/// What is known of the running process, kept up to date across restarts.
#[derive(Debug, Default)]
struct Running {
    /// Its process id; none once it has exited for good.
    pid: Option<u32>,
    /// Its metrics address (`127.0.0.1:<port>`, another at every start).
    metrics: Option<String>,
}

/// One supervised replica.
#[derive(Debug)]
pub(crate) struct Replica {
    identity: String,
    running: Arc<Mutex<Running>>,
    kill: Option<oneshot::Sender<()>>,
    supervisor: JoinHandle<()>,
}

impl Replica {
    /// Starts the replica and waits until it serves its metrics; from then on, a lost Lease
    /// starts it again and counts in `restarts`.
    pub(crate) async fn start(
        identity: &str,
        launch: Launch,
        restarts: Arc<AtomicU32>,
    ) -> Result<Self, Error> {
        let (child, ready, drained) = run(&launch).await?;
        let running = Arc::new(Mutex::new(Running {
            pid: child.id(),
            metrics: metrics_addr(&ready),
        }));
        let (kill, killed) = oneshot::channel();
        let supervisor = tokio::spawn(supervise(
            identity.to_owned(),
            launch,
            (child, drained),
            Arc::clone(&running),
            killed,
            restarts,
        ));
        Ok(Self {
            identity: identity.to_owned(),
            running,
            kill: Some(kill),
            supervisor,
        })
    }

    /// Its identity in the Lease.
    pub(crate) fn identity(&self) -> &str {
        &self.identity
    }

    /// Its process id, while it runs.
    pub(crate) fn pid(&self) -> Option<u32> {
        self.running.lock().ok().and_then(|r| r.pid)
    }

    /// Its metrics address, while it runs.
    pub(crate) fn metrics(&self) -> Option<String> {
        self.running.lock().ok().and_then(|r| r.metrics.clone())
    }

    /// Kills it with SIGKILL, as a crash would, and waits until it is gone; it is not started
    /// again.
    pub(crate) async fn kill(mut self) {
        if let Some(kill) = self.kill.take() {
            let _ = kill.send(());
        }
        let _ = (&mut self.supervisor).await;
    }
}

impl Drop for Replica {
    fn drop(&mut self) {
        // The process is started with kill_on_drop: ending the supervisor ends it.
        self.supervisor.abort();
    }
}

/// Starts the process once.
async fn run(launch: &Launch) -> Result<(Child, String, JoinHandle<bool>), Error> {
    spawn_drained(
        launch.binary.clone(),
        &launch.args,
        &launch.kubeconfig,
        "metrics on",
        Some(Arc::clone(&launch.log)),
        Some(&launch.log_file),
    )
    .await
}

/// "metrics on http://127.0.0.1:<port>" → `127.0.0.1:<port>`.
fn metrics_addr(ready: &str) -> Option<String> {
    ready
        .rsplit("://")
        .next()
        .map(|addr| addr.trim().to_owned())
}

/// Writes a line of the harness's own into the replica's logs (its last lines and its file),
/// so a failure message shows the restart where it happened.
fn note(launch: &Launch, line: &str) {
    use std::io::Write as _;
    eprintln!("{line}");
    if let Ok(mut file) = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&launch.log_file)
    {
        let _ = writeln!(file, "{line}");
    }
    if let Ok(mut log) = launch.log.lock() {
        if log.len() >= LOG_LINES {
            log.pop_front();
        }
        log.push_back(line.to_owned());
    }
}

/// Waits for the process to exit or to be killed; starts it again after a lost Lease.
async fn supervise(
    identity: String,
    launch: Launch,
    (mut child, mut drained): (Child, JoinHandle<bool>),
    running: Arc<Mutex<Running>>,
    mut killed: oneshot::Receiver<()>,
    restarts: Arc<AtomicU32>,
) {
    let set = |pid: Option<u32>, metrics: Option<String>| {
        if let Ok(mut running) = running.lock() {
            *running = Running { pid, metrics };
        }
    };
    loop {
        tokio::select! {
            biased;
            _ = &mut killed => {
                set(None, None);
                let _ = child.kill().await;
                return;
            }
            status = child.wait() => {
                set(None, None);
                // Its stdout ends with it: every line it printed has been read.
                let lost_lease = (&mut drained).await.unwrap_or(false);
                let status = status.map(|s| s.to_string()).unwrap_or_else(|e| e.to_string());
                if !lost_lease {
                    note(&launch, &format!("sim target: manager replica {identity} exited ({status}); not restarted"));
                    return;
                }
                let count = restarts.fetch_add(1, Ordering::SeqCst) + 1;
                note(&launch, &format!("sim target: manager replica {identity} lost its Lease and exited ({status}); starting it again, as its Deployment would (lease-loss restart {count} of this target)"));
                match run(&launch).await {
                    Ok((next, ready, next_drained)) => {
                        set(next.id(), metrics_addr(&ready));
                        child = next;
                        drained = next_drained;
                    }
                    Err(error) => {
                        note(&launch, &format!("sim target: manager replica {identity} did not start again: {error}"));
                        return;
                    }
                }
            }
        }
    }
}
