//! `cargo xtask bench [render] [backup] [discovery] [webhook] [fleet]`: benchmarks, with the
//! reference implementation's rate
//! beside ours where there is one. Results are printed and written under `docs/benchmarks/`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result, bail};

use crate::envtest;
use crate::run::{cargo, run, run_forwarding_signals, trap_signals};

/// The benchmarks, by name.
const BENCHMARKS: &[&str] = &["render", "backup", "discovery", "webhook", "fleet"];

/// Names the snapshot size of the backup benchmark, in MiB (the spec's own variable).
const BACKUP_SIZE_ENV: &str = "ICHOR_BACKUP_SIZE_MIB";
/// The snapshot size of the backup benchmark unless `ICHOR_BACKUP_SIZE_MIB` says.
const BACKUP_SIZE_MIB: u64 = 512;

/// The machine's 1-minute load average, as `/proc/loadavg` gives it ("unknown" without one):
/// each benchmark's table says how busy the machine was.
pub(crate) fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The build's target folder: `CARGO_TARGET_DIR`, else `<root>/target`.
pub(crate) fn target_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR").map_or_else(|| root.join("target"), PathBuf::from)
}

/// The machine's cores (0 when unknown), named in each benchmark's document.
pub(crate) fn cores() -> usize {
    std::thread::available_parallelism().map_or(0, std::num::NonZero::get)
}

/// Where benchmark `name`'s spec or bench writes its table (`<target>/bench-<name>.md`),
/// with any table of an earlier run removed.
pub(crate) fn fresh_table(root: &Path, name: &str) -> PathBuf {
    let table = target_dir(root).join(format!("bench-{name}.md"));
    let _ = std::fs::remove_file(&table);
    table
}

/// `cargo test -p <package> --test <test> -- --nocapture`: a spec that measures.
pub(crate) fn spec(root: &Path, package: &str, test: &str) -> Command {
    let mut cmd = cargo(root);
    cmd.args(["test", "-p", package, "--test", test, "--", "--nocapture"]);
    cmd
}

/// Runs `cmd` (forwarding Ctrl-C to it) and reads the table it wrote to `table`.
pub(crate) fn run_for_table(cmd: Command, table: &Path) -> Result<String> {
    run_forwarding_signals(cmd)?;
    std::fs::read_to_string(table).with_context(|| format!("read the table {}", table.display()))
}

/// Prints benchmark `name`'s `document` and writes it to `docs/benchmarks/<name>.md`.
pub(crate) fn publish(root: &Path, name: &str, document: &str) -> Result<()> {
    print!("\n{document}");
    let dir = root.join("docs/benchmarks");
    std::fs::create_dir_all(&dir).context("create docs/benchmarks")?;
    std::fs::write(dir.join(format!("{name}.md")), document)
        .with_context(|| format!("write docs/benchmarks/{name}.md"))
}

/// Runs the named benchmarks (all when `which` is empty).
pub fn bench(root: &Path, which: &[String]) -> Result<()> {
    let all = which.is_empty();
    for name in which {
        if !BENCHMARKS.contains(&name.as_str()) {
            bail!(
                "unknown benchmark {name:?}: the benchmarks are: {}",
                BENCHMARKS.join(", ")
            );
        }
    }
    if all || which.iter().any(|w| w == "render") {
        render(root)?;
    }
    if all || which.iter().any(|w| w == "backup") {
        backup(root)?;
    }
    if all || which.iter().any(|w| w == "discovery") {
        crate::bench_discovery::discovery(root)?;
    }
    if all || which.iter().any(|w| w == "webhook") {
        crate::bench_webhook::webhook(root)?;
    }
    if all || which.iter().any(|w| w == "fleet") {
        crate::bench_fleet::fleet(root)?;
    }
    Ok(())
}

fn render(root: &Path) -> Result<()> {
    let load = load_average();
    let mut cmd = cargo(root);
    cmd.args(["bench", "-p", "ichor-render", "--bench", "render"]);
    run(cmd)?;
    let ours = 1e9 / criterion_mean_ns(root, "render_controlplane_1_14")?;
    let hostile_13 = criterion_mean_ns(root, "hostile_selector_1_13")? / 1e3;
    let hostile_14 = criterion_mean_ns(root, "hostile_selector_1_14")? / 1e3;

    // Talos's own generator, same bundle and inputs, through the 1.14 oracle.
    let oracle = envtest::oracles(root)?.join("talos-oracle-1.14");
    let bundle =
        std::fs::read_to_string(root.join("crates/ichor-render/tests/golden/bundle-1.14.yaml"))
            .context("read the test bundle")?;
    let request = serde_json::json!({
        "bundle": bundle,
        "clusterName": "lab",
        "endpoint": "https://192.168.10.5:6443",
        "kubernetesVersion": "1.36.3",
        "role": "controlplane",
        "installDisk": "/dev/sda",
        "patches": [
            "apiVersion: v1alpha1\nkind: TimeSyncConfig\nntp:\n  servers: [time.cloudflare.com]\n",
            "machine:\n  certSANs: [node.lab.internal]\n"
        ]
    });
    let mut child = Command::new(&oracle)
        .args(["bench", "2000"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .with_context(|| format!("run {}", oracle.display()))?;
    {
        use std::io::Write as _;
        let mut stdin = child.stdin.take().context("oracle stdin")?;
        stdin
            .write_all(request.to_string().as_bytes())
            .context("write the request")?;
    }
    let output = child.wait_with_output().context("wait for the oracle")?;
    let result: serde_json::Value =
        serde_json::from_slice(&output.stdout).context("parse the oracle's result")?;
    let talos = result["perSecond"]
        .as_f64()
        .with_context(|| format!("the oracle's benchmark failed: {result}"))?;

    let report = format!(
        "# Benchmark: rendering a machine config\n\n\
         A contract-1.14 control plane, from the golden test bundle, with a typed-document patch\n\
         and a v1alpha1 strategic patch (the same two patches for both); measured on this project's 2-core build machine\n\
         (1-minute load average {load} when it started: other work slows both implementations alike).\n\n\
         | implementation | configs per second | time per config |\n\
         |---|---:|---:|\n\
         | ichor-render (criterion, release) | {ours:.0} | {:.1} µs |\n\
         | Talos `generate.Input.Config` + configpatcher (Go, pkg/machinery v1.14.1) | {talos:.0} | {:.1} µs |\n\n\
         A machine reconcile's pure work over a hostile object: the config rendered for an\n\
         install `diskSelector` of 24 stars before a `b` (the model and serial globs on 1.13,\n\
         `glob()` in the CEL `match` on 1.14), then checked against a node reporting 16 disks\n\
         whose 256-character models and serials start with a multi-byte character. No disk\n\
         matches; before the linear glob this took longer than 15 s per disk, or panicked.\n\n\
         | hostile object | time per render and check |\n\
         |---|---:|\n\
         | 1.13 `diskSelector.model` and `.serial` | {hostile_13:.1} µs |\n\
         | 1.14 `diskSelector.match` with `glob()` | {hostile_14:.1} µs |\n\n\
         Reproduce with `cargo xtask bench render`.\n",
        1e6 / ours,
        1e6 / talos
    );
    publish(root, "render", &report)
}

/// Criterion's mean time of bench `name`, in nanoseconds, from its last run's estimates.
fn criterion_mean_ns(root: &Path, name: &str) -> Result<f64> {
    let estimates = target_dir(root).join(format!("criterion/{name}/new/estimates.json"));
    let estimates: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(&estimates)
            .with_context(|| format!("read {}", estimates.display()))?,
    )
    .context("parse criterion's estimates")?;
    estimates["mean"]["point_estimate"]
        .as_f64()
        .with_context(|| format!("criterion's mean estimate of {name}"))
}

/// Backups at size: the `backup_at_size` spec (crates/ichor-harness/tests/backup_at_size.rs)
/// streams a snapshot of `ICHOR_BACKUP_SIZE_MIB` MiB (512 unless set) through the manager as
/// the images ship it (release, statically linked) to SeaweedFS, measuring the manager's
/// resident set; its table goes to `docs/benchmarks/backup.md`.
fn backup(root: &Path) -> Result<()> {
    trap_signals()?;
    let size_mib = match std::env::var(BACKUP_SIZE_ENV) {
        Ok(text) => text
            .trim()
            .parse::<u64>()
            .with_context(|| format!("{BACKUP_SIZE_ENV} must be a whole number of MiB"))?,
        Err(_) => BACKUP_SIZE_MIB,
    };
    let assets = envtest::assets(root)?;
    let weed = envtest::seaweedfs(root)?;
    // The binaries the images ship: the figure that matters is the release build's.
    let shipped = crate::test::build_static(root)?;
    let report = fresh_table(root, "backup");
    let mut cmd = spec(root, "ichor-harness", "backup_at_size");
    cmd.env(crate::assets::ASSETS_ENV, assets)
        .env("ICHOR_WEED_BIN", weed)
        .env("ICHOR_MANAGER_BIN", shipped.join("ichor-manager"))
        .env("ICHOR_WEBHOOK_BIN", shipped.join("ichor-webhook"))
        .env(BACKUP_SIZE_ENV, size_mib.to_string())
        .env("ICHOR_BACKUP_REPORT", &report);
    // Other work on the machine slows the simulated node and the store: the figures say how
    // busy it was.
    let load = load_average();
    let table = run_for_table(cmd, &report)?;
    let cores = cores();
    let command = if size_mib == BACKUP_SIZE_MIB {
        "cargo xtask bench backup".to_owned()
    } else {
        format!("{BACKUP_SIZE_ENV}={size_mib} cargo xtask bench backup")
    };
    let report = format!(
        "# Benchmark: an etcd backup at size\n\n\
         A {size_mib} MiB etcd snapshot streamed from a simulated Talos control plane to a real S3\n\
         server (SeaweedFS on loopback) by `ichor-manager` as the images ship it (release,\n\
         statically linked): first on the `@every 24h` schedule, then for an `etcdSnapshot`\n\
         TalosOperation. Durations and sizes are the cluster's `status.backup.lastSuccess`; the\n\
         manager's resident set is read from `/proc/<pid>/status` (`VmRSS` sampled every 100 ms,\n\
         `VmHWM` reset before each backup); measured on this project's {cores}-core build machine\n\
         (1-minute load average {load} when the run started). The simulated node (in the\n\
         unoptimized test binary) and SeaweedFS share those cores with the manager, so the\n\
         throughput is this setup's, not the manager's limit, and varies with the machine's load;\n\
         the resident set does not.\n\n\
         {table}\n\
         The spec fails when a stored object's size differs from the recorded one, when a\n\
         snapshot is more than 1% smaller than asked for (the simulator sizes its database to just\n\
         under the size asked for), or when the manager's peak during a backup reaches a quarter of\n\
         the snapshot or 256 MiB: a manager that held the snapshot would need all of it, one that\n\
         streams it needs its own footprint and a few 5 MiB upload parts.\n\n\
         Reproduce with `{command}` (`{BACKUP_SIZE_ENV}` sets the size in MiB).\n"
    );
    publish(root, "backup", &report)
}
