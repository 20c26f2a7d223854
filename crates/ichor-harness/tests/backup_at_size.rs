//! Backups at size, on the sim target against the real `ichor-manager`: a snapshot of hundreds
//! of MiB (`ICHOR_BACKUP_SIZE_MIB`, 512 unless set) streams from a simulated control plane to a
//! real S3 server (SeaweedFS), once on the schedule and once for an `etcdSnapshot` operation,
//! and the manager's memory stays flat: its peak resident set is bounded by a few upload
//! parts, not by the snapshot. It prints a table of sizes, durations, throughput and the
//! manager's resident set before, at peak and after each backup.
//!
//! Not run by `cargo test` (`test = false`): `cargo xtask bench backup` runs it with a release
//! manager and writes the table to `docs/benchmarks/backup.md`.

use std::fmt::Write as _;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ichor_api::TalosCluster;
use ichor_api::TalosOperation;
use ichor_api::backup::BackupRecord;
use ichor_api::operation::{OperationAction, OperationPhase};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::S3Server;
use ichor_testenv::nets::BACKUP_AT_SIZE;
use ichor_testenv::wait::try_eventually;
use kube::api::{Api, Patch, PatchParams};
use object_store::ObjectStoreExt as _;
use object_store::path::Path as ObjectPath;
use serde_json::json;
use support::{put_store_secret, store_spec, talos_cluster};

mod support;

const CLUSTER: &str = "lab";
const BUCKET: &str = "etcd";
const MIB: u64 = 1 << 20;
/// Names the snapshot size in MiB.
const SIZE_ENV: &str = "ICHOR_BACKUP_SIZE_MIB";
/// Names a file the table is also written to (`cargo xtask bench backup` reads it).
const REPORT_ENV: &str = "ICHOR_BACKUP_REPORT";
/// The snapshot size in MiB unless `ICHOR_BACKUP_SIZE_MIB` says.
const DEFAULT_SIZE_MIB: u64 = 512;
/// The smallest size the spec takes: below it a quarter of the snapshot is within reach of the
/// manager's own footprint (about 40 MiB with a backup's buffers), and the bound would no
/// longer tell streaming from buffering.
const MIN_SIZE_MIB: u64 = 256;
/// How often the manager's resident set is sampled.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// The bound on the manager's peak resident set during a backup, as a share of the
/// snapshot: a manager that held the snapshot whole would need all of it, one that streams it
/// needs its own footprint and a few 5 MiB upload parts (about 40 MiB, whatever the size).
const PEAK_SHARE: f64 = 0.25;
/// The bound on the manager's peak resident set during a backup, whatever the snapshot's size.
const PEAK_LIMIT: u64 = 256 * MIB;
/// How long the cluster may take to become Ready.
const READY_WAIT: Duration = Duration::from_secs(300);

/// The requested snapshot size in bytes.
fn requested_size() -> u64 {
    let mib = match std::env::var(SIZE_ENV) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .unwrap_or_else(|_| panic!("{SIZE_ENV} must be a whole number of MiB, not {text:?}")),
        Err(_) => DEFAULT_SIZE_MIB,
    };
    assert!(
        mib >= MIN_SIZE_MIB,
        "{SIZE_ENV} must be at least {MIN_SIZE_MIB}: smaller, the memory bound proves nothing"
    );
    mib * MIB
}

/// How long one backup of `size` bytes may take: generous, for a loaded 2-core machine.
fn backup_wait(size: u64) -> Duration {
    Duration::from_secs(300 + 3 * size / MIB)
}

/// The pid of the manager process: this process's child named `ichor-manager`.
fn manager_pid() -> u32 {
    let me = std::process::id();
    let mut found = Vec::new();
    for entry in std::fs::read_dir("/proc").expect("read /proc").flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<u32>().ok())
        else {
            continue;
        };
        let Ok(stat) = std::fs::read_to_string(entry.path().join("stat")) else {
            continue;
        };
        // "<pid> (<comm>) <state> <ppid> …"; the name may hold spaces and parentheses.
        let (Some(open), Some(close)) = (stat.find('('), stat.rfind(')')) else {
            continue;
        };
        let comm = &stat[open + 1..close];
        let ppid = stat[close + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u32>().ok());
        if comm == "ichor-manager" && ppid == Some(me) {
            found.push(pid);
        }
    }
    assert_eq!(found.len(), 1, "one manager process: {found:?}");
    found[0]
}

/// Resets the process's peak resident set (`VmHWM`) to its current one; false when the
/// kernel refuses.
fn reset_peak(pid: u32) -> bool {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5").is_ok()
}

/// Samples a process's resident set on a thread of its own (the runtime's threads are busy
/// with the simulated node), keeping the largest seen since the last [`Sampler::take_max`].
struct Sampler {
    max: Arc<Mutex<u64>>,
    samples: Arc<Mutex<u64>>,
    stop: Arc<AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Sampler {
    fn start(pid: u32) -> Self {
        let max = Arc::new(Mutex::new(0));
        let samples = Arc::new(Mutex::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let thread = {
            let (max, samples, stop) = (Arc::clone(&max), Arc::clone(&samples), Arc::clone(&stop));
            std::thread::spawn(move || {
                while !stop.load(Ordering::SeqCst) {
                    let Some(rss) = support::read_status(pid, "VmRSS") else {
                        break;
                    };
                    let mut max = max.lock().expect("max");
                    *max = (*max).max(rss);
                    *samples.lock().expect("samples") += 1;
                    drop(max);
                    std::thread::sleep(SAMPLE_EVERY);
                }
            })
        };
        Self {
            max,
            samples,
            stop,
            thread: Some(thread),
        }
    }

    /// The largest resident set sampled since the last call, and how many samples were taken.
    fn take_max(&self) -> (u64, u64) {
        let max = std::mem::take(&mut *self.max.lock().expect("max"));
        let samples = std::mem::take(&mut *self.samples.lock().expect("samples"));
        (max, samples)
    }
}

impl Drop for Sampler {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

/// One backup, measured.
struct Measured {
    what: &'static str,
    record: BackupRecord,
    rss_before: u64,
    /// `VmHWM` at the end, reset just before the backup.
    peak: u64,
    /// The largest `VmRSS` sampled while it ran.
    sampled: u64,
    samples: u64,
    rss_after: u64,
}

/// The cluster's last successful backup, when its key is not `previous`.
async fn new_success(target: &SimTarget, previous: Option<&str>) -> Option<BackupRecord> {
    let record = talos_cluster(target, CLUSTER)
        .await
        .status?
        .backup
        .record?
        .last_success?;
    (Some(record.key.as_str()) != previous).then_some(record)
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / MIB as f64
}

/// The table `cargo xtask bench backup` puts in `docs/benchmarks/backup.md`.
fn table(runs: &[Measured]) -> String {
    let mut out = String::from(
        "| backup | snapshot | duration | throughput | manager RSS before | peak (VmHWM) | peak sampled | after |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for run in runs {
        let size = run.record.size as u64;
        let _ = writeln!(
            out,
            "| {} | {:.1} MiB | {:.1} s | {:.1} MiB/s | {:.1} MiB | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
            run.what,
            mib(size),
            run.record.duration_seconds,
            mib(size) / run.record.duration_seconds.max(0.001),
            mib(run.rss_before),
            mib(run.peak),
            mib(run.sampled),
            mib(run.rss_after),
        );
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_of_hundreds_of_mib_reaches_the_store_with_flat_manager_memory() {
    let version = "v1.14.1";
    let size = requested_size();
    let wait = backup_wait(size);
    let server = S3Server::start().await.expect("start the S3 server");
    server.create_bucket(BUCKET).await.expect("bucket");
    let bucket = support::bucket(&server, BUCKET);
    let target = SimTarget::up(SimOptions {
        etcd_size: size,
        ..SimOptions::new(1, BACKUP_AT_SIZE.net(0), version)
    })
    .await
    .expect("sim target");

    put_store_secret(&target, &server).await;

    // The cluster comes up without backups, so the manager's resident set before the first
    // one, read once the cluster is Ready, is its steady state (it is only reported; the
    // bounds are on the peak, reset just before each backup).
    specs::discovered_cluster(&target, version, 1, 1)
        .await
        .expect("cluster discovered");
    specs::approve_shape(&target, 1, 0).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, READY_WAIT).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }

    let pid = manager_pid();
    let sampler = Sampler::start(pid);
    let mut runs = Vec::new();

    // The first scheduled backup.
    let rss_before = support::status_bytes(pid, "VmRSS");
    let peak_reset = reset_peak(pid);
    sampler.take_max();
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(&json!({"spec": {"backup": {
                "schedule": "@every 24h",
                "store": store_spec(&server, BUCKET)
            }}})),
        )
        .await
        .expect("patch spec.backup");
    let started = Instant::now();
    let record = match try_eventually("the first scheduled backup", wait, || {
        new_success(&target, None)
    })
    .await
    {
        Ok(record) => record,
        Err(e) => panic!(
            "{e}: {:?}\n{}",
            talos_cluster(&target, CLUSTER).await.status,
            target.manager_log_tail()
        ),
    };
    let (sampled, samples) = sampler.take_max();
    runs.push(Measured {
        what: "scheduled",
        record,
        rss_before,
        peak: support::status_bytes(pid, "VmHWM"),
        sampled,
        samples,
        rss_after: support::status_bytes(pid, "VmRSS"),
    });
    eprintln!(
        "the scheduled backup reached the store {:.1} s after spec.backup was set",
        started.elapsed().as_secs_f64()
    );

    // One on demand.
    let rss_before = support::status_bytes(pid, "VmRSS");
    let peak_reset = reset_peak(pid) && peak_reset;
    sampler.take_max();
    specs::create_operation(
        &target,
        TalosOperation::test("at-size", OperationAction::EtcdSnapshot)
            .cluster(CLUSTER)
            .all(),
    )
    .await
    .expect("operation");
    let operation = specs::wait_operation(&target, "at-size", wait)
        .await
        .expect("finished");
    let (sampled, samples) = sampler.take_max();
    let peak = support::status_bytes(pid, "VmHWM");
    let rss_after = support::status_bytes(pid, "VmRSS");
    let status = operation.status.clone().expect("status");
    assert_eq!(
        status.run.phase,
        OperationPhase::Succeeded,
        "{status:?}\n{}",
        target.manager_log_tail()
    );
    let key = status.backup.key.clone().expect("the operation's key");
    let record = talos_cluster(&target, CLUSTER)
        .await
        .status
        .and_then(|s| s.backup.record?.last_success)
        .expect("lastSuccess");
    assert_eq!(record.key, key, "lastSuccess is the operation's backup");
    assert_eq!(record.operation.as_deref(), Some("at-size"));
    runs.push(Measured {
        what: "on demand (`etcdSnapshot`)",
        record,
        rss_before,
        peak,
        sampled,
        samples,
        rss_after,
    });
    drop(sampler);

    let report = table(&runs);
    println!("\n{report}");
    if let Some(path) = std::env::var_os(REPORT_ENV) {
        std::fs::write(&path, &report).expect("write the report");
    }

    // What is stored is what was recorded, and as large as asked: the simulator fills its
    // database up to just under the size asked for (a few pages and 1% of margin for the
    // pages it does not count ahead), so a snapshot within 1% of it is one of that size.
    for run in &runs {
        let meta = bucket
            .head(&ObjectPath::from(run.record.key.as_str()))
            .await
            .unwrap_or_else(|e| panic!("{}: the backup is in the bucket: {e}", run.what));
        assert_eq!(
            meta.size, run.record.size as u64,
            "{}: the stored object has the recorded size",
            run.what
        );
        assert!(
            meta.size >= size - size / 100,
            "{}: {} bytes stored, {size} asked for",
            run.what,
            meta.size
        );
    }
    // Flat memory: the peak during each backup is a small share of the snapshot.
    let bound = PEAK_LIMIT.min((size as f64 * PEAK_SHARE) as u64);
    for run in &runs {
        assert!(run.samples > 0, "{}: sampled while it ran", run.what);
        let peak = if peak_reset { run.peak } else { run.sampled };
        assert!(
            peak < bound,
            "{}: the manager's resident set peaked at {:.1} MiB during a {:.1} MiB backup (bound {:.1} MiB)",
            run.what,
            mib(peak),
            mib(run.record.size as u64),
            mib(bound)
        );
    }
    target.down().await;
}
