//! Running the built test executables, two at a time, as `cargo test` would run them one at a
//! time (docs/adr/0047).
//!
//! The suite's tests mostly wait: on kube-apiservers, simulated nodes and their timers. Cargo
//! runs one test executable after another, which left most of a core idle. Here two workers take
//! the executables from one queue, longest first (by the times of the last run, kept in the
//! cache; on a first run, the harness's specs, which are the long ones, go first). Each
//! executable runs in its package's folder, as cargo runs it, with its output kept in a log of
//! its own and printed whole when it ends, so that the two workers' outputs never interleave.

use std::collections::BTreeMap;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::run::wait_forwarding_signals;

/// How many test executables run at once: the two cores' worth of waiting work, beside the
/// README commands (which run on their own thread).
const WORKERS: usize = 2;

/// A guess, in seconds, for an executable the last run did not time: the harness's specs drive
/// whole simulated clusters and are the suite's long ones, so they start first.
fn first_guess(label: &str) -> f64 {
    if label.contains("/ichor-harness/tests/") {
        60.0
    } else {
        1.0
    }
}

/// One piece of work for a worker: a test executable (run with no arguments, in its package's
/// folder, as cargo runs it), or a command of its own such as the doc tests.
#[derive(Debug, Clone)]
pub struct Job {
    /// What the table and the log name it by: a test target's source, relative to the
    /// workspace root (`crates/ichor-harness/tests/chaos.rs`).
    pub label: String,
    /// The program.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<String>,
    /// The folder it runs in.
    pub dir: PathBuf,
    /// Variables of its own, beside the run's.
    pub env: Vec<(String, String)>,
}

impl Job {
    fn label(&self) -> &str {
        &self.label
    }

    fn command(&self, env: &[(&str, PathBuf)]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.args(&self.args).current_dir(&self.dir);
        for (key, value) in env {
            cmd.env(key, value);
        }
        for (key, value) in &self.env {
            cmd.env(key, value);
        }
        cmd
    }
}

/// How one job went.
#[derive(Debug)]
struct Outcome {
    label: String,
    took: Duration,
    ok: bool,
    counts: Counts,
}

/// Tests passed, failed and ignored, summed from libtest's `test result:` lines.
#[derive(Debug, Default, Clone, Copy, PartialEq)]
pub struct Counts {
    /// Tests that passed.
    pub passed: u64,
    /// Tests that failed.
    pub failed: u64,
    /// Tests that were ignored.
    pub ignored: u64,
}

impl Counts {
    /// Sums the `test result: ok. 3 passed; 0 failed; 1 ignored; …` lines of `output`.
    pub fn of(output: &str) -> Self {
        let mut counts = Self::default();
        for line in output.lines() {
            let Some(rest) = line.trim_start().strip_prefix("test result: ") else {
                continue;
            };
            for part in rest.split(';') {
                let mut words = part.split_whitespace().rev();
                let (Some(what), Some(n)) = (words.next(), words.next()) else {
                    continue;
                };
                let Ok(n) = n.parse::<u64>() else { continue };
                match what {
                    "passed" => counts.passed += n,
                    "failed" => counts.failed += n,
                    "ignored" => counts.ignored += n,
                    _ => {}
                }
            }
        }
        counts
    }

    fn add(&mut self, other: Self) {
        self.passed += other.passed;
        self.failed += other.failed;
        self.ignored += other.ignored;
    }
}

/// The order to run `jobs` in: longest first, by `times` (seconds, by label) where known.
fn longest_first(mut jobs: Vec<Job>, times: &BTreeMap<String, f64>) -> Vec<Job> {
    let guess = |job: &Job| {
        times
            .get(job.label())
            .copied()
            .unwrap_or_else(|| first_guess(job.label()))
    };
    // Stable: jobs of equal weight keep cargo's order.
    jobs.sort_by(|a, b| guess(b).total_cmp(&guess(a)));
    jobs
}

/// Reads the last run's times (`label<TAB>seconds` lines); a missing or garbled file is no
/// times, not an error.
fn read_times(path: &Path) -> BTreeMap<String, f64> {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter_map(|line| {
            let (label, seconds) = line.split_once('\t')?;
            Some((label.to_owned(), seconds.parse().ok()?))
        })
        .collect()
}

fn write_times(path: &Path, outcomes: &[Outcome]) {
    let text: String = outcomes
        .iter()
        .map(|o| format!("{}\t{:.1}\n", o.label, o.took.as_secs_f64()))
        .collect();
    let _ = std::fs::write(path, text);
}

/// Runs every job on [`WORKERS`] threads, each job's output going to a log in `logs` and then
/// to stderr whole; fails naming every job that failed. `times` keeps the run's times for the
/// next run's order.
pub fn run_all(
    jobs: Vec<Job>,
    env: &[(&str, PathBuf)],
    logs: &Path,
    times: &Path,
) -> Result<Counts> {
    std::fs::create_dir_all(logs).with_context(|| format!("create {}", logs.display()))?;
    let queue = Mutex::new(longest_first(jobs, &read_times(times)).into_iter());
    let outcomes = Mutex::new(Vec::new());
    let print = Mutex::new(());
    std::thread::scope(|scope| {
        for _ in 0..WORKERS {
            scope.spawn(|| {
                loop {
                    let next = queue.lock().map(|mut q| q.next()).ok().flatten();
                    let Some(job) = next else { break };
                    let outcome = run_one(&job, env, logs, &print);
                    if let Ok(mut all) = outcomes.lock() {
                        all.push(outcome);
                    }
                    if crate::run::interrupted() {
                        break;
                    }
                }
            });
        }
    });
    let outcomes = outcomes.into_inner().unwrap_or_default();
    write_times(times, &outcomes);
    let mut counts = Counts::default();
    for outcome in &outcomes {
        counts.add(outcome.counts);
    }
    eprintln!(
        "\ntests: {} passed, {} failed, {} ignored, in {} executables",
        counts.passed,
        counts.failed,
        counts.ignored,
        outcomes.len()
    );
    let failed: Vec<&str> = outcomes
        .iter()
        .filter(|o| !o.ok)
        .map(|o| o.label.as_str())
        .collect();
    if crate::run::interrupted() {
        bail!("interrupted while running the tests");
    }
    if !failed.is_empty() {
        bail!(
            "{} test executables failed (their output is above): {}",
            failed.len(),
            failed.join(", ")
        );
    }
    Ok(counts)
}

/// Runs one job with its output in a log of its own, then prints the log whole.
fn run_one(job: &Job, env: &[(&str, PathBuf)], logs: &Path, print: &Mutex<()>) -> Outcome {
    let label = job.label().to_owned();
    let log_path = logs.join(format!("{}.log", label.replace(['/', ' '], "_")));
    let started = Instant::now();
    let ok = (|| -> Result<()> {
        let log =
            File::create(&log_path).with_context(|| format!("create {}", log_path.display()))?;
        let mut cmd = job.command(env);
        cmd.stdout(log.try_clone().context("share the log")?)
            .stderr(log);
        wait_forwarding_signals(cmd)
    })();
    let took = started.elapsed();
    let output = std::fs::read_to_string(&log_path).unwrap_or_default();
    let counts = Counts::of(&output);
    let _guard = print.lock();
    eprintln!("     Running {label} ({:.1} s)", took.as_secs_f64());
    eprint!("{output}");
    if let Err(err) = &ok {
        eprintln!("error: {label}: {err:#}");
    }
    Outcome {
        label,
        took,
        ok: ok.is_ok(),
        counts,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exe(label: &str) -> Job {
        Job {
            label: label.to_owned(),
            program: PathBuf::from("true"),
            args: Vec::new(),
            dir: PathBuf::from("/"),
            env: Vec::new(),
        }
    }

    #[test]
    fn the_longest_known_job_goes_first_and_the_harness_specs_lead_the_unknown_ones() {
        let jobs = vec![
            exe("crates/ichor-api/src/lib.rs"),
            exe("crates/ichor-harness/tests/chaos.rs"),
            exe("crates/ichor-talos/tests/limits.rs"),
            exe("crates/ichor-manager/src/lib.rs"),
        ];
        let order = |times: &BTreeMap<String, f64>| -> Vec<String> {
            longest_first(jobs.clone(), times)
                .iter()
                .map(|j| j.label().to_owned())
                .collect()
        };
        assert_eq!(
            order(&BTreeMap::new()),
            [
                "crates/ichor-harness/tests/chaos.rs",
                "crates/ichor-api/src/lib.rs",
                "crates/ichor-talos/tests/limits.rs",
                "crates/ichor-manager/src/lib.rs",
            ]
        );
        let times = BTreeMap::from([
            ("crates/ichor-talos/tests/limits.rs".to_owned(), 120.0),
            ("crates/ichor-harness/tests/chaos.rs".to_owned(), 90.0),
            ("crates/ichor-api/src/lib.rs".to_owned(), 0.2),
        ]);
        assert_eq!(
            order(&times),
            [
                "crates/ichor-talos/tests/limits.rs",
                "crates/ichor-harness/tests/chaos.rs",
                "crates/ichor-manager/src/lib.rs",
                "crates/ichor-api/src/lib.rs",
            ]
        );
    }

    #[test]
    fn counts_sum_every_result_line_and_a_garbled_times_file_is_no_times() {
        let output = "running 3 tests\n\
            test result: ok. 3 passed; 0 failed; 1 ignored; 0 measured; 0 filtered out; finished in 0.1s\n\
            test result: FAILED. 2 passed; 1 failed; 0 ignored; 0 measured; 0 filtered out\n";
        assert_eq!(
            Counts::of(output),
            Counts {
                passed: 5,
                failed: 1,
                ignored: 1
            }
        );
        let dir = std::env::temp_dir().join(format!("xtask-times-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("times.tsv");
        std::fs::write(&path, "a\t1.5\nno tab\nb\tnot a number\n").unwrap();
        assert_eq!(read_times(&path), BTreeMap::from([("a".to_owned(), 1.5)]));
        assert!(read_times(&dir.join("missing")).is_empty());
        std::fs::remove_dir_all(dir).unwrap();
    }

    #[test]
    fn every_job_runs_and_a_failing_one_is_named() {
        let dir = std::env::temp_dir().join(format!("xtask-run-{}", std::process::id()));
        let mut fails = exe("fails");
        fails.program = PathBuf::from("false");
        let jobs = vec![exe("one"), fails, exe("two")];
        let err = run_all(jobs, &[], &dir.join("logs"), &dir.join("times.tsv")).unwrap_err();
        assert!(
            err.to_string().contains("1 test executables failed"),
            "{err}"
        );
        assert!(err.to_string().contains("fails"), "{err}");
        let times = read_times(&dir.join("times.tsv"));
        assert_eq!(times.len(), 3, "{times:?}");
        run_all(
            vec![exe("one"), exe("two")],
            &[],
            &dir.join("logs"),
            &dir.join("times.tsv"),
        )
        .unwrap();
        std::fs::remove_dir_all(dir).unwrap();
    }
}
