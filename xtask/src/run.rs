//! Running child commands: echoing them, timing phases, and surviving Ctrl-C long enough to
//! clean up.

use std::path::Path;
use std::process::{Child, Command, ExitStatus};
use std::sync::Arc;
use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use signal_hook::consts::{SIGINT, SIGTERM};

fn flag() -> &'static Arc<AtomicBool> {
    static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)))
}

/// From now on SIGINT and SIGTERM set a flag instead of killing xtask, so it can clean up.
pub fn trap_signals() -> Result<()> {
    for signal in [SIGINT, SIGTERM] {
        signal_hook::flag::register(signal, Arc::clone(flag()))
            .context("install signal handler")?;
    }
    Ok(())
}

/// Whether SIGINT or SIGTERM arrived.
pub fn interrupted() -> bool {
    flag().load(Ordering::SeqCst)
}

fn describe(cmd: &Command) -> String {
    let mut text = cmd.get_program().to_string_lossy().into_owned();
    for arg in cmd.get_args() {
        text.push(' ');
        text.push_str(&arg.to_string_lossy());
    }
    text
}

/// A `cargo` command (the one running xtask, per `CARGO`) in the workspace `root`.
pub fn cargo(root: &Path) -> Command {
    let mut cmd = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()));
    cmd.current_dir(root);
    cmd
}

/// Installs a tool from crates.io, `spec` being `name@version`, with `cargo install --locked`
/// under the light release profile (into `CARGO_INSTALL_ROOT` when set).
pub fn cargo_install(root: &Path, spec: &str) -> Result<()> {
    let mut cmd = cargo(root);
    cmd.args(["install", "--locked", spec]);
    light_install_profile(&mut cmd);
    run(cmd)
}

/// Overrides the release profile of a tool that `cargo install` builds: without fat LTO and a
/// single codegen unit (cargo-deny's own settings, made for the binaries it publishes), its
/// build takes a fraction of the time, and a check over this workspace's few hundred crates
/// stays a matter of seconds.
fn light_install_profile(cmd: &mut Command) {
    cmd.env("CARGO_PROFILE_RELEASE_LTO", "off")
        .env("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "16")
        .env("CARGO_PROFILE_RELEASE_OPT_LEVEL", "1");
}

/// Runs `cmd` to completion, failing on a non-zero exit.
pub fn run(mut cmd: Command) -> Result<()> {
    let what = describe(&cmd);
    eprintln!("+ {what}");
    let status = cmd
        .status()
        .with_context(|| format!("cannot run `{what}`"))?;
    check(&what, status)
}

fn check(what: &str, status: ExitStatus) -> Result<()> {
    if interrupted() {
        bail!("interrupted while running `{what}`");
    }
    if !status.success() {
        bail!("`{what}` failed ({status})");
    }
    Ok(())
}

/// Runs `cmd` in its own process group, forwarding SIGINT/SIGTERM to that group, and waits.
pub fn run_forwarding_signals(cmd: Command) -> Result<()> {
    eprintln!("+ {}", describe(&cmd));
    wait_forwarding_signals(cmd)
}

/// [`run_forwarding_signals`] without echoing the command.
pub fn wait_forwarding_signals(mut cmd: Command) -> Result<()> {
    use std::os::unix::process::CommandExt as _;
    let what = describe(&cmd);
    let mut child: Child = cmd
        .process_group(0)
        .spawn()
        .with_context(|| format!("cannot run `{what}`"))?;
    let group = Pid::from_raw(i32::try_from(child.id()).context("child pid")?);
    let mut forwarded = false;
    loop {
        if let Some(status) = child.try_wait().context("wait for child")? {
            return check(&what, status);
        }
        if interrupted() && !forwarded {
            eprintln!("xtask: interrupted; stopping `{what}`");
            let _ = killpg(group, Signal::SIGINT);
            forwarded = true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// The machine's CPU time so far, from `/proc/stat`'s first line: (busy, all) in clock ticks,
/// summed over every core; `None` where there is no such file.
fn cpu_ticks() -> Option<(u64, u64)> {
    let stat = std::fs::read_to_string("/proc/stat").ok()?;
    let line = stat.lines().next()?.strip_prefix("cpu ")?;
    let ticks: Vec<u64> = line
        .split_whitespace()
        .map(|t| t.parse().ok())
        .collect::<Option<_>>()?;
    // user nice system idle iowait irq softirq steal (guest time is already inside user).
    let all: u64 = ticks.iter().take(8).sum();
    let idle = ticks.get(3)? + ticks.get(4)?;
    Some((all - idle, all))
}

/// How many cores were busy on average between two [`cpu_ticks`] readings.
fn cores_busy(from: Option<(u64, u64)>, to: Option<(u64, u64)>) -> Option<f64> {
    let ((busy0, all0), (busy1, all1)) = (from?, to?);
    let all = all1.checked_sub(all0).filter(|&a| a > 0)?;
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    Some(busy1.saturating_sub(busy0) as f64 / all as f64 * cores as f64)
}

/// One row of the timing table: a phase's name, wall time, outcome, and how many cores the
/// whole machine kept busy meanwhile (`None` for background steps, which overlap the phases).
type Row = (String, Duration, bool, Option<f64>);

/// Wall times of the phases of one task, printed as a table at the end.
#[derive(Default)]
pub struct Phases {
    done: Vec<Row>,
    background: Vec<Row>,
}

impl Phases {
    /// Runs one named phase, recording its duration and outcome.
    pub fn phase<T>(&mut self, name: &str, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if interrupted() {
            bail!("interrupted before phase `{name}`");
        }
        eprintln!("\n==> {name}");
        let start = Instant::now();
        let ticks = cpu_ticks();
        let result = f();
        let busy = cores_busy(ticks, cpu_ticks());
        self.done
            .push((name.to_owned(), start.elapsed(), result.is_ok(), busy));
        result
    }

    /// Records a step that ran beside the phases: shown in the table, not added to the total.
    pub fn record_background(&mut self, name: &str, took: Duration, ok: bool) {
        self.background
            .push((format!("{name} (background)"), took, ok, None));
    }

    /// Records one of the steps that ran side by side within the phase before: shown in the
    /// table, not added to the total.
    pub fn record_beside(&mut self, name: &str, took: Duration, ok: bool) {
        self.background
            .push((format!("{name} (side by side)"), took, ok, None));
    }

    /// Prints the timing table to stderr.
    pub fn print(&self) {
        let width = self
            .done
            .iter()
            .chain(&self.background)
            .map(|(n, ..)| n.len())
            .max()
            .unwrap_or(5)
            .max(5);
        let total: Duration = self.done.iter().map(|(_, d, ..)| *d).sum();
        eprintln!(
            "\n{:<width$}  {:>9}  {:>10}  result",
            "phase", "seconds", "cores busy"
        );
        for (name, took, ok, busy) in self.done.iter().chain(&self.background) {
            let result = if *ok { "ok" } else { "FAILED" };
            let busy = busy.map_or_else(String::new, |b| format!("{b:.2}"));
            eprintln!(
                "{name:<width$}  {:>9.1}  {busy:>10}  {result}",
                took.as_secs_f64()
            );
        }
        eprintln!("{:<width$}  {:>9.1}", "total", total.as_secs_f64());
    }
}
