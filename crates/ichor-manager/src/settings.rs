//! The manager's tunables ([`Settings`]) and their defaults: what the binary's flags set and
//! what `docs/tuning.md` lists.

use std::time::Duration;

use ichor_talos::discovery::SweepConfig;

/// The default install stall limit: a real machine pulls the installer image and writes the
/// disk in minutes; half an hour leaves room for a slow mirror or disk.
pub const DEFAULT_INSTALL_STALL_LIMIT: Duration = Duration::from_secs(30 * 60);

/// Tunables.
#[derive(Debug, Clone)]
pub struct Settings {
    /// How nodes are probed during discovery.
    pub sweep: SweepConfig,
    /// How long Bootstrap may keep answering `FailedPrecondition` in one attempt.
    pub bootstrap_patience: Duration,
    /// Requeue while a machine or cluster is progressing.
    pub progress_requeue: Duration,
    /// Requeue once settled.
    pub settled_requeue: Duration,
    /// At most how many settled machines are looked at a second, fleet-wide: a fleet bigger
    /// than this many settled requeues' worth waits longer between settled looks (ADR 0041).
    pub settled_looks_per_second: u32,
    /// How long an install may run before the machine shows `InstallStalled` (Talos puts no
    /// deadline on its installer).
    pub install_stall_limit: Duration,
    /// Who writes Events.
    pub reporter: String,
    /// This replica's identity (pod name).
    pub instance: String,
    /// How long the published kubeconfig and talosconfig certificates live (renewed at two
    /// thirds of it).
    pub credential_lifetime: Duration,
    /// How long the certificates the manager mints for its own calls live (renewed at two
    /// thirds of it).
    pub own_credential_lifetime: Duration,
    /// How many reconciles of one kind run at once (each controller's limit): what bounds the
    /// Talos connections and the reconcile state held at once, whatever the fleet size.
    pub concurrency: u16,
}

/// Reconciles of one kind that run at once unless `--concurrent-reconciles` says.
pub const DEFAULT_CONCURRENCY: u16 = 16;

/// Settled looks a second unless `--settled-looks-per-second` says: up to 180 machines are
/// looked at every settled requeue (60 s), a bigger fleet less often (ADR 0041).
pub const DEFAULT_SETTLED_LOOKS_PER_SECOND: u32 = 3;

impl Default for Settings {
    fn default() -> Self {
        Self {
            sweep: SweepConfig::default(),
            bootstrap_patience: Duration::from_secs(10),
            progress_requeue: Duration::from_secs(2),
            settled_requeue: Duration::from_secs(60),
            settled_looks_per_second: DEFAULT_SETTLED_LOOKS_PER_SECOND,
            install_stall_limit: DEFAULT_INSTALL_STALL_LIMIT,
            reporter: "ichor-manager".into(),
            instance: "ichor-manager".into(),
            credential_lifetime: ichor_render::credentials::CLIENT_TTL,
            own_credential_lifetime: Duration::from_secs(3600),
            concurrency: DEFAULT_CONCURRENCY,
        }
    }
}
