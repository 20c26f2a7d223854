//! Etcd backups to a cluster's `spec.backup` store: the scheduled controller, and the runner
//! it shares with `etcdSnapshot` operations. The decisions (when, from which node, what
//! retention deletes) are [`plan`]'s; what a backup reads is `observe`'s, what it writes
//! (the store, the status) `act`'s, and this module runs them in order.
//!
//! A backup streams the snapshot from a Ready control plane that is not being removed, through
//! a bounded channel, into a multipart upload (optionally through `age`, to a recipient only),
//! checking the size and SHA-256 trailer as it passes and hashing the object as stored:
//! nothing is held whole, and a snapshot that does not check out is aborted, never completed.
//! A record beside the object (`<key>.json`) says whose it is, the bundle it was made with and
//! what the object (its `sha256sum`) and the snapshot inside must check out as; a backup
//! without one is incomplete. Then retention deletes this cluster's oldest backups, and
//! nothing else. A plain `http://` store carries only encrypted backups unless the spec says
//! otherwise, and a backup asked for once is taken once, whatever cached copy the reconcile
//! that asks started from (ADR 0050).

mod act;
mod observe;
pub mod plan;

use std::collections::BTreeSet;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ichor_api::TalosCluster;
use ichor_api::backup::{BackupRecord, BackupRun};
use ichor_api::names::{controllers, reasons};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::ResourceExt as _;
use kube::api::Api;
use kube::runtime::controller::{Action, Controller};
use kube::runtime::reflector::ObjectRef;
use tokio::sync::mpsc;

use crate::infra::shared::Changes;
use crate::{Context, Error, Stop};
use plan::{BackupId, Owner, Plan, Record, Schedule};

pub use act::store;
pub use observe::{Destination, age_identity, destination};

/// The size of each uploaded part (S3's smallest but the last is 5 MiB).
pub(crate) const PART: usize = 5 * 1024 * 1024;
/// Parts in flight at once: with the part being filled, what a backup holds in memory.
pub(crate) const PARTS_IN_FLIGHT: usize = 2;
/// Snapshot chunks queued between the node and the upload.
pub(crate) const CHUNKS_QUEUED: usize = 64;
/// When a scheduled backup finds another running, it looks again after this.
pub(crate) const BUSY_RETRY: Duration = Duration::from_secs(10);

/// Who asked for a backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Trigger {
    /// The schedule.
    Scheduled,
    /// A TalosOperation (`etcdSnapshot`), from this machine.
    Operation {
        /// The operation's name.
        operation: String,
        /// The control plane it targets.
        machine: String,
    },
    /// A rollout about to disrupt a control plane (`spec.rollout.freshBackup`, ADR 0075): taken
    /// unless the last successful backup is younger than `max_age`.
    Rollout {
        /// The oldest the last successful backup may be.
        max_age: Duration,
    },
}

impl Trigger {
    /// The operation that asked, if one did.
    fn operation(&self) -> Option<String> {
        match self {
            Self::Operation { operation, .. } => Some(operation.clone()),
            Self::Scheduled | Self::Rollout { .. } => None,
        }
    }
}

/// The fresh backups rollouts ask for (`spec.rollout.freshBackup`, ADR 0075): per cluster,
/// the oldest its last success may be. A control plane's turn asks ([`FreshAsks::ask`]); the
/// backup controller, woken, takes the backup from its own reconcile and forgets the ask.
/// Kept in memory: a new leader learns it again from the next look at the turn.
#[derive(Debug)]
pub struct FreshAsks {
    wanted: Mutex<std::collections::BTreeMap<String, Duration>>,
    woken: tokio::sync::broadcast::Sender<ObjectRef<TalosCluster>>,
}

/// How many asks wait for the backup controller at most; past that the oldest are dropped,
/// and their turns ask again at their next look.
const ASKS_QUEUED: usize = 256;

impl Default for FreshAsks {
    fn default() -> Self {
        Self {
            wanted: Mutex::default(),
            woken: tokio::sync::broadcast::channel(ASKS_QUEUED).0,
        }
    }
}

impl FreshAsks {
    /// Asks for a backup of `cluster` unless its last success is younger than `max_age`, and
    /// wakes the backup controller for it.
    pub fn ask(&self, cluster: &TalosCluster, max_age: Duration) {
        if let Ok(mut wanted) = self.wanted.lock() {
            let age = wanted.entry(cluster_key(cluster)).or_insert(max_age);
            *age = (*age).min(max_age);
        }
        // No controller listening (a test's context): nothing to wake.
        let _ = self.woken.send(ObjectRef::from_obj(cluster));
    }

    /// The age asked for `cluster`'s backup, if a rollout asks for one.
    fn wanted(&self, cluster: &TalosCluster) -> Option<Duration> {
        self.wanted.lock().ok()?.get(&cluster_key(cluster)).copied()
    }

    /// Forgets the ask for `cluster` (its backup ended, either way).
    fn answered(&self, cluster: &TalosCluster) {
        if let Ok(mut wanted) = self.wanted.lock() {
            wanted.remove(&cluster_key(cluster));
        }
    }

    /// The clusters asked for from now on, for the backup controller's `reconcile_on`.
    fn asked(&self) -> impl futures::Stream<Item = ObjectRef<TalosCluster>> + Send + 'static {
        crate::infra::shared::broadcast_stream(self.woken.subscribe())
    }
}

/// The clusters with a backup running in this process: one at a time per cluster.
#[derive(Debug, Default)]
pub struct InFlight(Mutex<BTreeSet<String>>);

/// Held while a backup of one cluster runs; released on drop.
struct Slot<'a> {
    set: &'a InFlight,
    key: String,
}

impl InFlight {
    fn take(&self, key: String) -> Option<Slot<'_>> {
        // The guard goes before a slot exists: a slot's drop takes the lock.
        let taken = self.0.lock().ok()?.insert(key.clone());
        taken.then(|| Slot { set: self, key })
    }
}

impl Drop for Slot<'_> {
    fn drop(&mut self) {
        if let Ok(mut set) = self.set.0.lock() {
            set.remove(&self.key);
        }
    }
}

/// The cluster's key in [`InFlight`].
fn cluster_key(cluster: &TalosCluster) -> String {
    format!(
        "{}/{}",
        cluster.namespace().unwrap_or_default(),
        cluster.name_any()
    )
}

/// The backup controller: each TalosCluster with `spec.backup`, reconciled when it changes and
/// when its next backup is due.
pub(crate) async fn run_controller(ctx: Arc<Context>, stop: tokio::sync::watch::Receiver<bool>) {
    // The clusters from the manager's one cluster watch (`Context::clusters`).
    let controller = Controller::for_shared_stream(
        ctx.clusters.subscribe(Changes::Applied),
        ctx.clusters.store(),
    )
    .reconcile_on(ctx.fresh_backups.asked());
    crate::infra::drive::drive(controllers::BACKUP, controller, reconcile, ctx, stop).await;
}

/// Reconciles the backups of one TalosCluster: runs a scheduled backup when one is due, and
/// comes back when the next is.
pub async fn reconcile(cluster: Arc<TalosCluster>, ctx: Arc<Context>) -> Result<Action, Error> {
    let Some(spec) = cluster.spec.backup.as_ref() else {
        return Ok(Action::await_change());
    };
    if cluster.metadata.deletion_timestamp.is_some() {
        return Ok(Action::await_change());
    }
    if let Some(max_age) = ctx.fresh_backups.wanted(&cluster) {
        return fresh_for_rollout(&ctx, &cluster, max_age).await;
    }
    let schedule = match Schedule::parse(&spec.schedule) {
        Ok(schedule) => schedule,
        Err(problem) => {
            let failure = Stop::new(reasons::BACKUP_SETTINGS_INVALID, problem.to_string());
            act::record_failure(&ctx, &cluster, &failure, false).await?;
            return Ok(Action::await_change());
        }
    };
    let facts = plan::facts(ctx.clock.now(), &cluster, spec);
    match plan::plan(&schedule, &facts) {
        Plan::Idle => Ok(Action::await_change()),
        Plan::Wait { due } => {
            act::record_next_run(&ctx, &cluster, Some(due)).await?;
            Ok(Action::requeue(plan::until(facts.now, due)))
        }
        Plan::Run => match run(&ctx, &cluster, Trigger::Scheduled).await? {
            None => Ok(Action::requeue(BUSY_RETRY)),
            // The write of its outcome reconciles again, and plans the next.
            Some(_) => Ok(Action::await_change()),
        },
    }
}

/// Takes the backup a rollout asked for (ADR 0075), unless the last success is fresh enough;
/// the ask is answered once a backup ended, either way. Another backup running: looked at
/// again soon.
async fn fresh_for_rollout(
    ctx: &Context,
    cluster: &TalosCluster,
    max_age: Duration,
) -> Result<Action, Error> {
    if plan::fresh_success(cluster, ctx.clock.now(), max_age).is_some() {
        ctx.fresh_backups.answered(cluster);
        return Ok(Action::await_change());
    }
    match run(ctx, cluster, Trigger::Rollout { max_age }).await? {
        None => Ok(Action::requeue(BUSY_RETRY)),
        Some(_) => {
            ctx.fresh_backups.answered(cluster);
            // The write of its outcome reconciles again, and plans the next scheduled one.
            Ok(Action::await_change())
        }
    }
}

/// Runs one backup of `cluster` now and records its outcome (status, condition, Event,
/// metrics), if the cluster and the operation as stored still ask for it: `cluster` may be a
/// cached copy that has not yet seen the last backup's status (ADR 0050). An operation whose
/// status already names its backup gets that backup's record back and nothing is taken again.
/// `None`: no backup now, as another backup of the cluster is running or, for the schedule,
/// none is due.
pub async fn run(
    ctx: &Context,
    cluster: &TalosCluster,
    trigger: Trigger,
) -> Result<Option<Result<BackupRecord, Stop>>, Error> {
    let Some(_slot) = ctx.backups.take(cluster_key(cluster)) else {
        return Ok(None);
    };
    // Read under the slot: a backup of this cluster that ended before has written its status.
    let Some(fresh) = observe::read_fresh(ctx, cluster).await? else {
        return Ok(None);
    };
    let cluster = &fresh;
    // The backup's futures (a streamed upload, its digests and encryption) are large: each is
    // boxed so that the reconciles awaiting a backup keep theirs small. Inline, a debug build's
    // worker thread overflowed its stack under an operation's reconcile.
    match Box::pin(observe::asked(ctx, cluster, &trigger)).await? {
        observe::Asked::Take => {}
        observe::Asked::NotDue => return Ok(None),
        observe::Asked::Taken(outcome) => return Ok(Some(outcome)),
    }
    let started = Instant::now();
    let outcome = Box::pin(attempt(ctx, cluster, &trigger, started)).await?;
    let seconds = started.elapsed().as_secs_f64();
    match &outcome {
        Ok(record) => {
            ctx.metrics.backup_succeeded(cluster, seconds, record.size);
            act::record_success(ctx, cluster, record).await?;
        }
        Err(failure) => {
            ctx.metrics.backup_failed(cluster, failure.reason);
            act::record_failure(ctx, cluster, failure, true).await?;
        }
    }
    Ok(Some(outcome))
}

/// Everything a backup does but record its outcome.
async fn attempt(
    ctx: &Context,
    cluster: &TalosCluster,
    trigger: &Trigger,
    started: Instant,
) -> Result<Result<BackupRecord, Stop>, Error> {
    let prepared = match observe::prepare(ctx, cluster, trigger).await? {
        Ok(prepared) => prepared,
        Err(failure) => return Ok(Err(failure)),
    };
    let observe::Prepared {
        spec,
        dest,
        sealer,
        bundle_fingerprint,
        source,
        client,
    } = prepared;
    let (namespace, name) = (cluster.namespace().unwrap_or_default(), cluster.name_any());
    let uid = cluster.uid().unwrap_or_default();
    let owner = Owner {
        prefix: &dest.prefix,
        namespace: &namespace,
        name: &name,
        uid: &uid,
    };
    let taken_at = ctx.clock.now();
    let key = owner.key(taken_at, &BackupId::random(), sealer.is_some());
    let operation = trigger.operation();
    let run = BackupRun {
        since: Time(taken_at),
        key: key.clone(),
        machine: source.machine.clone(),
        operation: operation.clone(),
    };
    act::record_running(ctx, cluster, Some(run)).await?;
    let base = Record {
        bundle_fingerprint,
        taken_at: taken_at.to_string(),
        machine: source.machine.clone(),
        ..plan::record_of(cluster)
    };
    let (tx, rx) = mpsc::channel::<Vec<u8>>(CHUNKS_QUEUED);
    let snapshot = client.etcd_snapshot_to(tx, |_| {});
    let record = match act::store(&dest, &key, sealer, base, rx, snapshot).await {
        Ok(record) => record,
        Err(failure) => return Ok(Err(failure)),
    };
    let kept = act::retain(ctx, cluster, &dest, &owner, spec).await;
    act::record_kept(ctx, cluster, kept).await?;
    Ok(Ok(BackupRecord {
        key,
        taken_at: Time(taken_at),
        size: i64::try_from(record.size).unwrap_or(i64::MAX),
        sha256: record.sha256,
        duration_seconds: started.elapsed().as_secs_f64(),
        machine: source.machine,
        operation,
    }))
}

/// The cluster's API, in its namespace.
fn api(ctx: &Context, cluster: &TalosCluster) -> Api<TalosCluster> {
    Api::namespaced(ctx.client.clone(), &cluster.namespace().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_backup_at_a_time_per_cluster_and_the_slot_frees_on_drop() {
        let running = InFlight::default();
        let first = running.take("ns/lab".into()).expect("free");
        assert!(running.take("ns/lab".into()).is_none(), "taken");
        assert!(running.take("ns/other".into()).is_some(), "per cluster");
        drop(first);
        assert!(running.take("ns/lab".into()).is_some(), "freed");
    }

    #[test]
    fn a_rollouts_ask_keeps_the_strictest_age_until_answered() {
        let asks = FreshAsks::default();
        let lab = TalosCluster::test("lab").build();
        let other = TalosCluster::test("other").build();
        assert_eq!(asks.wanted(&lab), None);
        asks.ask(&lab, Duration::from_secs(3600));
        asks.ask(&lab, Duration::from_secs(600));
        asks.ask(&lab, Duration::from_secs(7200));
        assert_eq!(asks.wanted(&lab), Some(Duration::from_secs(600)));
        assert_eq!(asks.wanted(&other), None, "per cluster");
        asks.answered(&lab);
        assert_eq!(asks.wanted(&lab), None);
    }
}
