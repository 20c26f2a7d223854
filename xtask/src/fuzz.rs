//! `cargo xtask fuzz [TARGET] [--seconds N]`: the fuzz targets of `fuzz/` (cargo-fuzz, libFuzzer,
//! docs/adr/0032), built with the nightly toolchain into the cache and run on a scratch copy of
//! their committed corpus, so that a run never grows `fuzz/corpus/`. A target that fails makes
//! the task fail, naming the target and the input it saved.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, Result, bail};

use crate::run::run as run_cmd;

/// The cargo-fuzz release installed when none is on PATH.
const CARGO_FUZZ: &str = "cargo-fuzz@0.13.2";

/// The fuzz targets, in the order they run.
pub const TARGETS: &[&str] = &[
    "admission_review",
    "config_patch",
    "secrets_bundle",
    "talos_reply",
    "credentials_file",
    "glob",
    "deadlines",
];

/// The fuzzing time of a whole run when none is given, split across the targets.
pub const DEFAULT_TOTAL_SECONDS: u64 = 60;

/// The target triple the fuzz targets are built for (libFuzzer's, and this machine's).
const TRIPLE: &str = "x86_64-unknown-linux-gnu";

/// The build options: no sanitizer (the crates forbid `unsafe`, and AddressSanitizer doubles
/// the build), and debug assertions with overflow checks on.
const BUILD_OPTIONS: &[&str] = &[
    "--fuzz-dir",
    "fuzz",
    "--sanitizer",
    "none",
    "--debug-assertions",
    "--target",
    TRIPLE,
];

/// `cargo +nightly`, through rustup's proxy, whatever toolchain runs xtask.
fn nightly_cargo(root: &Path) -> Command {
    let mut cmd = Command::new("cargo");
    cmd.current_dir(root)
        .arg("+nightly")
        .env_remove("RUSTUP_TOOLCHAIN")
        .env_remove("CARGO")
        .env_remove("RUSTC")
        .env_remove("RUSTDOC");
    cmd
}

/// Where the fuzz build (its cargo target folder), its scratch corpora (`corpus/`) and its
/// crash inputs (`artifacts/`) live: in the cargo target folder (the CI cache), beside the
/// workspace's build.
fn work_dir(root: &Path) -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map_or_else(|| root.join("target"), PathBuf::from)
        .join("fuzz")
}

/// Fails, saying what to install, unless the nightly toolchain is there.
pub fn ensure_nightly(root: &Path) -> Result<()> {
    let output = nightly_cargo(root)
        .arg("--version")
        .stderr(Stdio::null())
        .output();
    match output {
        Ok(out) if out.status.success() => {
            eprintln!("fuzz: {}", String::from_utf8_lossy(&out.stdout).trim());
            Ok(())
        }
        _ => bail!(
            "the nightly Rust toolchain is not installed: cargo-fuzz builds libFuzzer's instrumentation with it; install it with `rustup toolchain install nightly --profile minimal`"
        ),
    }
}

/// Installs cargo-fuzz (into `CARGO_INSTALL_ROOT`, the CI cache) unless it is there.
pub fn ensure_cargo_fuzz(root: &Path) -> Result<()> {
    let present = nightly_cargo(root)
        .args(["fuzz", "--version"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if present {
        eprintln!("cargo-fuzz is installed");
        return Ok(());
    }
    crate::run::cargo_install(root, CARGO_FUZZ)
}

/// Checks for nightly, installs cargo-fuzz if needed and builds every target.
pub fn build(root: &Path) -> Result<()> {
    ensure_nightly(root)?;
    ensure_cargo_fuzz(root)?;
    let mut cmd = nightly_cargo(root);
    cmd.args(["fuzz", "build"])
        .args(BUILD_OPTIONS)
        .arg("--target-dir")
        .arg(work_dir(root));
    run_cmd(cmd)
}

/// Copies `from`'s files into a fresh `to`.
fn fresh_copy(from: &Path, to: &Path) -> Result<()> {
    if to.exists() {
        std::fs::remove_dir_all(to).with_context(|| format!("remove {}", to.display()))?;
    }
    std::fs::create_dir_all(to).with_context(|| format!("create {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("read {}", from.display()))? {
        let entry = entry.with_context(|| format!("read {}", from.display()))?;
        std::fs::copy(entry.path(), to.join(entry.file_name()))
            .with_context(|| format!("copy {}", entry.path().display()))?;
    }
    Ok(())
}

/// The input libFuzzer saved for a failure in `artifacts`, if any.
fn saved_input(artifacts: &Path) -> Option<PathBuf> {
    std::fs::read_dir(artifacts)
        .ok()?
        .filter_map(Result::ok)
        .map(|e| e.path())
        .find(|p| p.is_file())
}

/// Runs one built target for `seconds` on a scratch copy of its corpus.
fn run_target(root: &Path, target: &str, seconds: u64) -> Result<()> {
    let work = work_dir(root);
    let corpus = work.join("corpus").join(target);
    fresh_copy(&root.join("fuzz/corpus").join(target), &corpus)?;
    let artifacts = work.join("artifacts").join(target);
    if artifacts.exists() {
        std::fs::remove_dir_all(&artifacts)
            .with_context(|| format!("remove {}", artifacts.display()))?;
    }
    std::fs::create_dir_all(&artifacts)
        .with_context(|| format!("create {}", artifacts.display()))?;
    // The built binary itself (`cargo fuzz run` would check the build again, seconds a target).
    let binary = work.join(TRIPLE).join("release").join(target);
    let mut cmd = Command::new(&binary);
    cmd.current_dir(root)
        .arg(&corpus)
        .arg(format!("-max_total_time={seconds}"))
        .arg(format!("-artifact_prefix={}/", artifacts.display()))
        .arg("-print_final_stats=1");
    let dict = root.join("fuzz/dicts").join(format!("{target}.dict"));
    if dict.is_file() {
        cmd.arg(format!("-dict={}", dict.display()));
    }
    run_cmd(cmd).map_err(|error| match saved_input(&artifacts) {
        Some(input) => anyhow::anyhow!(
            "fuzz target {target} failed; the input is saved at {} (replay: {} {}): {error:#}",
            input.display(),
            binary.display(),
            input.display()
        ),
        None => anyhow::anyhow!("fuzz target {target} failed: {error:#}"),
    })
}

/// Runs `targets` one after another, `seconds` each; fails naming every target that failed.
pub fn run(root: &Path, targets: &[&str], seconds: u64) -> Result<()> {
    let mut failed = Vec::new();
    for target in targets {
        eprintln!("\n==> fuzz {target} for {seconds} s");
        let started = Instant::now();
        let result = run_target(root, target, seconds);
        eprintln!(
            "fuzz {target}: {} in {:.0} s",
            if result.is_ok() { "ok" } else { "FAILED" },
            started.elapsed().as_secs_f64()
        );
        if let Err(error) = result {
            eprintln!("{error:#}");
            failed.push(format!("{error:#}"));
        }
        if crate::run::interrupted() {
            bail!("interrupted while fuzzing {target}");
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} of {} fuzz targets failed:\n{}",
            failed.len(),
            targets.len(),
            failed.join("\n")
        )
    }
}

/// `cargo xtask fuzz [TARGET] [--seconds N]`: builds, then runs one target or all of them, for
/// `seconds` each (default: [`DEFAULT_TOTAL_SECONDS`] split across the targets run).
pub fn fuzz(root: &Path, target: Option<&str>, seconds: Option<u64>) -> Result<()> {
    let targets: Vec<&str> = match target {
        Some(name) => match TARGETS.iter().find(|t| **t == name) {
            Some(t) => vec![*t],
            None => bail!(
                "unknown fuzz target {name:?}: one of {}",
                TARGETS.join(", ")
            ),
        },
        None => TARGETS.to_vec(),
    };
    let seconds = seconds.unwrap_or(DEFAULT_TOTAL_SECONDS / targets.len() as u64);
    build(root)?;
    run(root, &targets, seconds.max(1))
}
