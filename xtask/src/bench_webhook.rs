//! `cargo xtask bench webhook`: `oha`, an HTTP load generator from crates.io, drives
//! `ichor-webhook` as the images ship it (release, statically linked) over TLS, backed by a
//! real kube-apiserver and etcd, and at the same concurrency a bare TLS server answering a
//! fixed body (`ichor-tls-echo`, the limit). The spec `crates/ichor-webhook/tests/under_load.rs`
//! runs both and writes the table; this wraps it into `docs/benchmarks/webhook.md`.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use anyhow::{Context as _, Result};

use crate::bench;
use crate::envtest;
use crate::run::{cargo, run, trap_signals};
use crate::test::{build_static, build_static_packages};

/// The load generator's version: installed into the cache on first use.
const OHA_VERSION: &str = "1.16.0";

/// Names the seconds of each measured run (the spec's own variable).
const SECONDS_ENV: &str = "ICHOR_WEBHOOK_BENCH_SECONDS";
/// Names the number of connections (the spec's own variable).
const CONCURRENCY_ENV: &str = "ICHOR_WEBHOOK_BENCH_CONCURRENCY";

/// `oha` from crates.io, installed on first use into the cache (`<cache>/oha-VERSION/bin`).
/// Built against native-tls (the system's OpenSSL) rather than its default rustls, whose
/// default crypto provider is aws-lc: it is the client of both servers alike, not part of
/// Ichor.
fn ensure_oha(root: &Path) -> Result<PathBuf> {
    let dir = crate::assets::cache_root().join(format!("oha-{OHA_VERSION}"));
    let bin = dir.join("bin/oha");
    let present = Command::new(&bin)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        eprintln!("oha {OHA_VERSION} is installed: {}", bin.display());
        return Ok(bin);
    }
    let mut cmd = cargo(root);
    cmd.args(["install", "--locked", "--version", OHA_VERSION])
        .args([
            "--no-default-features",
            "--features",
            "native-tls",
            "--root",
        ])
        .arg(&dir)
        .arg("oha");
    run(cmd).context("install oha (native-tls needs OpenSSL's headers and pkg-config)")?;
    Ok(bin)
}

/// Builds `ichor-tls-echo` as the webhook is built for the images: release, statically linked.
fn build_echo(root: &Path) -> Result<PathBuf> {
    Ok(build_static_packages(root, &["ichor-tls-echo"])?.join("ichor-tls-echo"))
}

/// Runs the benchmark and writes `docs/benchmarks/webhook.md`.
pub fn webhook(root: &Path) -> Result<()> {
    trap_signals()?;
    let oha = ensure_oha(root)?;
    let assets = envtest::assets(root)?;
    let shipped = build_static(root)?;
    let echo = build_echo(root)?;
    let report = bench::fresh_table(root, "webhook");
    let mut cmd = bench::spec(root, "ichor-webhook", "under_load");
    cmd.env(crate::assets::ASSETS_ENV, assets)
        .env("ICHOR_WEBHOOK_BIN", shipped.join("ichor-webhook"))
        .env("ICHOR_TLS_ECHO_BIN", echo)
        .env("ICHOR_OHA_BIN", &oha)
        .env("ICHOR_WEBHOOK_BENCH_REPORT", &report);
    let table = bench::run_for_table(cmd, &report)?;
    bench::publish(root, "webhook", &document(&table))
}

/// The document around the spec's `table`.
fn document(table: &str) -> String {
    let cores = bench::cores();
    let settings: Vec<String> = [SECONDS_ENV, CONCURRENCY_ENV]
        .iter()
        .filter_map(|name| std::env::var(name).ok().map(|v| format!("{name}={v} ")))
        .collect();
    format!(
        "# Benchmark: the admission webhook under load\n\n\
         `oha` {OHA_VERSION} (from crates.io) sends AdmissionReview bodies over TLS (HTTP/1.1,\n\
         keep-alive, one request in flight per connection) to `ichor-webhook` as the images ship\n\
         it (release, statically linked), running as its own user with the shipped RBAC against\n\
         a real kube-apiserver and etcd (the test environment's), and at the same concurrency to\n\
         `ichor-tls-echo`: the same server stack (axum, rustls on ring) reading each body and\n\
         answering a fixed JSON body of an AdmissionReview answer's size, deciding nothing. That\n\
         is the limit on this machine. Everything shares this project's {cores}-core build\n\
         machine: the load generator, the server, the apiserver and etcd.\n\n\
         - **Mix A**, refusals and worker deletes, no writes: each request, at random, the delete\n\
           of an applied control plane without the allow-delete annotation (refused) or of an\n\
           applied worker (allowed, nothing reserved), in a cluster of three healthy control\n\
           planes and two workers.\n\
         - **Mix B**, an allowed control-plane delete with its removal reservation: the delete\n\
           of an annotated control plane of another such cluster, admitted by writing the\n\
           reservation on its TalosCluster (a `resourceVersion`-guarded replace). The\n\
           reservation is removed before each run; within a run the first review writes it and\n\
           the others find it standing and replace the TalosCluster with it unchanged, so each\n\
           review still reads the cluster and its machines and sends the replace.\n\n\
         Reviews/s and latencies are oha's; the CPU columns are each process's share of a core\n\
         over the run (`/proc/<pid>/stat`), etcd writes the growth of etcd's revision (the\n\
         apiserver's own lease renewals included).\n\n\
         {table}\n\
         Reproduce with `{}cargo xtask bench webhook` (`{SECONDS_ENV}` sets the seconds of each\n\
         run, `{CONCURRENCY_ENV}` the connections).\n",
        settings.concat()
    )
}
