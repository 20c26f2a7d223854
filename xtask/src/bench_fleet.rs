//! `cargo xtask bench fleet`: the `fleet` spec set (crates/ichor-harness/tests/fleet.rs) runs a
//! fleet of simulated machines over many clusters on one manager as the images ship it
//! (release, statically linked), at each size of `ICHOR_FLEET_SIZES` (100, 300 and 1000 unless
//! set), with the apiserver's audit log on: all-Ready, an idle round, then the first
//! cluster's `talosVersion` bumped alone and every other cluster's at once; its tables go to
//! `docs/benchmarks/fleet.md`.

use std::path::Path;

use anyhow::{Context as _, Result};

use crate::bench;
use crate::envtest;
use crate::run::trap_signals;

/// Names the fleet sizes (the spec's own variable).
const SIZES_ENV: &str = "ICHOR_FLEET_SIZES";
/// Names every cluster's `spec.rollout.maxUnavailable` (the spec's own variable).
const MAX_UNAVAILABLE_ENV: &str = "ICHOR_FLEET_MAX_UNAVAILABLE";
/// The fleet sizes unless `ICHOR_FLEET_SIZES` says.
const DEFAULT_SIZES: &str = "100,300,1000";

/// Runs the fleet benchmark and writes its table.
pub fn fleet(root: &Path) -> Result<()> {
    trap_signals()?;
    let sizes = std::env::var(SIZES_ENV).unwrap_or_else(|_| DEFAULT_SIZES.to_owned());
    let assets = envtest::assets(root)?;
    // The binaries the images ship: the figures that matter are the release build's.
    let shipped = crate::test::build_static(root)?;
    let report = bench::fresh_table(root, "fleet");
    let audit = bench::target_dir(root).join("bench-fleet-audit");
    let _ = std::fs::remove_dir_all(&audit);
    std::fs::create_dir_all(&audit).context("create the audit folder")?;
    // The spec's own process serves the simulated nodes: built optimized, so that the nodes
    // answer as fast as the manager asks (unoptimized, a thousand of them held a core and
    // answered calls past the manager's 10 s limit, and bounded every figure).
    let mut cmd = crate::run::cargo(root);
    cmd.args([
        "test",
        "--release",
        "-p",
        "ichor-harness",
        "--test",
        "fleet",
        "--",
        "--nocapture",
    ]);
    cmd.env(crate::assets::ASSETS_ENV, assets)
        .env("ICHOR_MANAGER_BIN", shipped.join("ichor-manager"))
        .env("ICHOR_WEBHOOK_BIN", shipped.join("ichor-webhook"))
        .env("ICHOR_AUDIT_DIR", &audit)
        .env(SIZES_ENV, &sizes)
        .env("ICHOR_FLEET_REPORT", &report);
    let load = bench::load_average();
    let table = bench::run_for_table(cmd, &report)?;
    let _ = std::fs::remove_dir_all(&audit);
    let cores = bench::cores();
    let mut command = if sizes == DEFAULT_SIZES {
        "cargo xtask bench fleet".to_owned()
    } else {
        format!("{SIZES_ENV}={sizes} cargo xtask bench fleet")
    };
    // Every cluster's `spec.rollout.maxUnavailable`, when set (the spec reads it itself).
    if let Ok(most) = std::env::var(MAX_UNAVAILABLE_ENV) {
        command = format!("{MAX_UNAVAILABLE_ENV}={most} {command}");
    }
    let report = format!(
        "# Benchmark: a fleet on one manager\n\n\
         One `ichor-manager` as the images ship it (release, statically linked, its default\n\
         2 s requeue, 60 s settled requeue and at most 3 settled looks a second) against a real\n\
         kube-apiserver (collecting garbage at `GOGC=400`, as every test's does, ADR 0072), with N simulated\n\
         Talos machines in maintenance mode served by one simulator process, in N/20\n\
         TalosClusters (three control planes and seventeen workers each), every cluster\n\
         discovering its own /27 of loopback addresses. Every machine is approved with one patch\n\
         (role and hostname, sixteen in flight); the clock runs from the first approval until\n\
         every cluster is Ready. No workload control planes run: a cluster is Ready once every\n\
         machine runs and its control planes are etcd voters. Then the manager idles until it\n\
         has looked at every machine again (a round of settled looks, 60 s at least). Then\n\
         the first cluster's `spec.talosVersion` is bumped by a patch version alone, and then\n\
         every other cluster's at once; each clock runs until their nodes run it and their\n\
         machines and clusters say so; the clusters' drain is off (`spec.drain.enabled: false`),\n\
         since no workload API runs to drain through.\n\
         The manager's peak resident set is `VmHWM` from `/proc/<pid>/status` over the run\n\
         until the upgrade; its idle CPU is `utime + stime` from `/proc/<pid>/stat` over that idle round;\n\
         reconciles are its `ichor_reconciles_total`; apiserver requests are the manager's\n\
         entries in the apiserver's audit log (watches and lists included); Talos RPCs are the\n\
         calls the simulated nodes received (discovery's maintenance probes included). Measured\n\
         on this project's {cores}-core build machine (1-minute load average {load} when the run\n\
         started); the apiserver, etcd and the simulator (in the spec's own process, built\n\
         optimized, on two threads of its own) share those cores with the manager, so durations are this setup's,\n\
         and memory, reconciles, requests and RPCs are the manager's own.\n\n\
         {table}\n\
         Reproduce with `{command}` (`{SIZES_ENV}` takes comma-separated machine counts,\n\
         multiples of 20 up to 1280).\n"
    );
    bench::publish(root, "fleet", &report)
}
