//! The README's commands, run as a new user would run them (in their short forms), so that
//! none can break unnoticed. Every `cargo xtask …` the README names is either run here or
//! listed with the reason it is not; a README edit that adds, renames or drops a command fails
//! this phase until the list below follows it.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

use crate::run::interrupted;

/// Commands run to completion, exactly as the README writes them.
const RUN: &[&str] = &[
    "cargo xtask envtest-assets",
    "cargo xtask oracles",
    "cargo xtask bins",
    "cargo xtask redfish-tools",
    "cargo xtask e2e --target sim",
    "cargo xtask demo --until-ready",
];

/// The simulator command of the README: it serves until stopped, so it runs until its nodes
/// and control endpoint are up.
const SIM: &str = "\"$(cargo xtask bins | tail -n 1)/ichor-sim\" --nodes 3 --base 127.0.10.1 --talos-version v1.14.1";

/// The demo as the README starts it: it runs until Ctrl-C, and the README's talosctl block is
/// run against it first.
const DEMO: &str = "cargo xtask demo";

/// Commands the README names that this phase does not run, and why.
const NOT_RUN: &[(&str, &str)] = &[
    ("cargo xtask test", "this run is that command"),
    (
        "cargo xtask bench render",
        "a benchmark (release builds, minutes) that rewrites docs/benchmarks/render.md",
    ),
    (
        "cargo xtask bench backup",
        "a benchmark (a release build, a snapshot of hundreds of MiB) that rewrites docs/benchmarks/backup.md",
    ),
    (
        "cargo xtask bench discovery",
        "a benchmark (root, nftables rules, release builds) that rewrites docs/benchmarks/discovery.md",
    ),
    (
        "cargo xtask bench webhook",
        "a benchmark (oha built on first use, release builds) that rewrites docs/benchmarks/webhook.md",
    ),
    (
        "cargo xtask bench fleet",
        "a benchmark (a release manager and up to a thousand simulated machines, many minutes) that rewrites docs/benchmarks/fleet.md",
    ),
    (
        "cargo xtask fuzz",
        "a nightly-toolchain build and a fuzzing run, run before a release and reported in docs/ci.md (ADR 0045)",
    ),
    (
        "cargo xtask release",
        "the images' release build, run before a release and reported in docs/ci.md (ADR 0045); the tests' build links the same way",
    ),
    (
        "cargo xtask crdgen",
        "it rewrites config/; the ichor-api tests fail whenever config/ differs from what it writes",
    ),
    (
        "cargo xtask k8s-replaces",
        "it rewrites tools/k8s/go.mod; the run checks the block with `k8s-replaces --check`",
    ),
];

/// What the README's talosctl block needs from a running demo.
#[derive(Debug, PartialEq)]
struct DemoFacts {
    namespace: String,
    net: String,
}

/// Runs the phase: checks the lists against the README, then runs its commands. Their output
/// goes to the terminal, or, with `log`, to that file alone (so that it does not interleave
/// with the tests' when the two run side by side).
pub fn check(root: &Path, env: &[(&str, PathBuf)], log: Option<&Path>) -> Result<()> {
    let log = log
        .map(|path| File::create(path).with_context(|| format!("create {}", path.display())))
        .transpose()?;
    let run = Runner { root, env, log };
    let readme = std::fs::read_to_string(root.join("README.md")).context("read README.md")?;
    coverage(&readme)?;
    for (command, why) in NOT_RUN {
        run.say(&format!("not run: `{command}`: {why}"));
    }
    for command in RUN {
        run.shell(command)?;
    }
    run.serve_until(SIM, "control http://", Duration::from_secs(60))?;
    run.demo_with_talosctl(&readme)
}

/// Every `cargo xtask …` in the README is run or excused, and every listed command is in it.
fn coverage(readme: &str) -> Result<()> {
    let listed: Vec<&str> = RUN
        .iter()
        .copied()
        .chain([SIM, DEMO])
        .chain(NOT_RUN.iter().map(|(c, _)| *c))
        .collect();
    for command in &listed {
        if !readme.contains(command) {
            bail!(
                "README.md no longer says `{command}`: update xtask/src/readme.rs to the commands it names"
            );
        }
    }
    for (at, _) in readme.match_indices("cargo xtask") {
        let rest = &readme[at..];
        let end = rest
            .find(['\n', '`', '(', ')', ';', ','])
            .unwrap_or(rest.len());
        let mention = rest[..end].trim_end_matches(['.', ':', ' ']);
        // `cargo xtask <task>` names the tool, not a command.
        let placeholder = mention["cargo xtask".len()..].trim_start().starts_with('<');
        let covered = placeholder || listed.iter().any(|c| mention.starts_with(c));
        // `--target cluster` and `--target qemu` need hardware (docs/e2e.md).
        let hardware = mention.contains("--target cluster") || mention.contains("--target qemu");
        if !covered && !hardware {
            bail!(
                "README.md names `{mention}`, which xtask/src/readme.rs neither runs nor excuses"
            );
        }
    }
    Ok(())
}

/// How the phase runs its commands: in the workspace, with the run's variables, writing to the
/// terminal or to one log file.
struct Runner<'a> {
    root: &'a Path,
    env: &'a [(&'a str, PathBuf)],
    log: Option<File>,
}

impl Runner<'_> {
    /// Writes one line of the phase's own (what it runs, what it skips).
    fn say(&self, line: &str) {
        match &self.log {
            Some(file) => {
                let mut file: &File = file;
                let _ = writeln!(file, "{line}");
            }
            None => eprintln!("{line}"),
        }
    }

    /// Where a command's output goes: the log file, or the terminal.
    fn output(&self) -> Result<Stdio> {
        match &self.log {
            Some(file) => Ok(file.try_clone().context("share the log file")?.into()),
            None => Ok(Stdio::inherit()),
        }
    }

    fn bash(&self, script: &str) -> Result<Command> {
        let mut cmd = Command::new("bash");
        cmd.args(["-euo", "pipefail", "-c", script])
            .current_dir(self.root)
            .stderr(self.output()?);
        for (key, value) in self.env {
            cmd.env(key, value);
        }
        Ok(cmd)
    }

    /// Runs `script` to completion, failing on a non-zero exit.
    fn shell(&self, script: &str) -> Result<()> {
        self.say(&format!("+ {script}"));
        let status = self
            .bash(script)?
            .stdout(self.output()?)
            .status()
            .with_context(|| format!("cannot run `{script}`"))?;
        if interrupted() {
            bail!("interrupted while running `{script}`");
        }
        if !status.success() {
            bail!("`{script}` failed ({status})");
        }
        Ok(())
    }
}

/// A long-running command in its own process group, its stdout lines sent to a channel.
struct Served {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
    seen: Vec<String>,
}

impl Served {
    fn start(run: &Runner<'_>, script: &str) -> Result<Self> {
        use std::os::unix::process::CommandExt as _;
        run.say(&format!("+ {script} &"));
        let mut echo: Box<dyn std::io::Write + Send> = match &run.log {
            Some(file) => Box::new(file.try_clone().context("share the log file")?),
            None => Box::new(std::io::stdout()),
        };
        let mut child = run
            .bash(script)?
            .stdout(Stdio::piped())
            .process_group(0)
            .spawn()
            .with_context(|| format!("start `{script}`"))?;
        let stdout = child.stdout.take().context("stdout")?;
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                let _ = writeln!(echo, "{line}");
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Self {
            child,
            lines,
            seen: Vec::new(),
        })
    }

    /// Waits for a line containing `marker`.
    fn wait_for(&mut self, marker: &str, limit: Duration) -> Result<()> {
        let deadline = Instant::now() + limit;
        loop {
            if self.seen.iter().any(|l| l.contains(marker)) {
                return Ok(());
            }
            let left = deadline.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(line) => self.seen.push(line),
                Err(_) => bail!("no line containing {marker:?} within {limit:?}"),
            }
        }
    }

    /// Sends SIGINT (a terminal's Ctrl-C) to the group and waits for a clean exit.
    fn interrupt(mut self) -> Result<()> {
        let group = Pid::from_raw(i32::try_from(self.child.id()).context("pid")?);
        let _ = killpg(group, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(60);
        while Instant::now() < deadline {
            if let Some(status) = self.child.try_wait().context("wait")? {
                use std::os::unix::process::ExitStatusExt as _;
                // Ending on Ctrl-C is how a foreground program stops: exit 0, the shell's 130,
                // or death by SIGINT (a program without a handler).
                let interrupted = status.code() == Some(130) || status.signal() == Some(2);
                if status.success() || interrupted {
                    return Ok(());
                }
                bail!("it exited with {status} after Ctrl-C");
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = killpg(group, Signal::SIGKILL);
        bail!("it did not stop within 60 s of Ctrl-C")
    }
}

impl Drop for Served {
    /// On a failure, the command is stopped the way a person would: Ctrl-C (which `cargo
    /// xtask demo` forwards to the process group it started), and only then SIGKILL.
    fn drop(&mut self) {
        let Ok(pid) = i32::try_from(self.child.id()) else {
            return;
        };
        let group = Pid::from_raw(pid);
        let _ = killpg(group, Signal::SIGINT);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        let _ = killpg(group, Signal::SIGKILL);
        let _ = self.child.wait();
    }
}

impl Runner<'_> {
    fn serve_until(&self, script: &str, marker: &str, limit: Duration) -> Result<()> {
        let mut served = Served::start(self, script)?;
        served
            .wait_for(marker, limit)
            .with_context(|| format!("`{script}`"))?;
        served.interrupt().with_context(|| format!("`{script}`"))
    }

    /// Starts the demo, runs the README's talosctl block against it, then stops it with Ctrl-C.
    fn demo_with_talosctl(&self, readme: &str) -> Result<()> {
        let block = talosctl_block(readme)?;
        let mut demo = Served::start(self, DEMO)?;
        demo.wait_for("Ctrl-C stops everything", Duration::from_secs(300))
            .context("`cargo xtask demo`")?;
        let facts = demo_facts(&demo.seen).context("read the demo's instructions")?;
        // A watch (`-w`) runs until stopped: it must still be running after 5 s.
        let script: String = fill(&block, &facts)
            .lines()
            .map(|line| {
                if line.contains(" -w") {
                    format!("{{ timeout 5 {} || test $? -eq 124; }}\n", line.trim())
                } else {
                    format!("{line}\n")
                }
            })
            .collect();
        self.shell(&script)
            .context("the README's talosctl block against the demo")?;
        demo.interrupt().context("`cargo xtask demo`")
    }
}

/// The README's sh block that drives talosctl.
fn talosctl_block(readme: &str) -> Result<String> {
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in readme.lines() {
        match (&mut current, line.trim_start()) {
            (None, l) if l.starts_with("```sh") => current = Some(String::new()),
            (Some(_), l) if l.starts_with("```") => blocks.extend(current.take()),
            (Some(text), _) => {
                text.push_str(line);
                text.push('\n');
            }
            _ => {}
        }
    }
    blocks
        .into_iter()
        .find(|b| b.contains("talosctl"))
        .context("README.md has no sh block with talosctl")
}

/// The namespace and node network the demo's instructions name.
fn demo_facts(lines: &[String]) -> Result<DemoFacts> {
    let after = |marker: &str| {
        lines.iter().find_map(|line| {
            let (_, rest) = line.split_once(marker)?;
            rest.split_whitespace().next().map(str::to_owned)
        })
    };
    let namespace =
        after("kubectl -n ").context("no `kubectl -n <namespace>` in the demo's output")?;
    let net = after(" -n 127.0.")
        .and_then(|address| address.split('.').next().map(str::to_owned))
        .context("no `-n 127.0.<net>.1` in the demo's output")?;
    Ok(DemoFacts { namespace, net })
}

fn fill(block: &str, facts: &DemoFacts) -> String {
    block
        .replace("<namespace>", &facts.namespace)
        .replace("<net>", &facts.net)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_demo_output_names_the_namespace_and_network() {
        let lines = [
            "  kubectl -n e2e-77da2c35 get talosclusters,talosmachines".to_owned(),
            "  \"$(cargo xtask oracles | tail -n 1)/talosctl\" --talosconfig x -n 127.0.10.1 get members".to_owned(),
        ];
        assert_eq!(
            demo_facts(&lines).unwrap(),
            DemoFacts {
                namespace: "e2e-77da2c35".into(),
                net: "10".into()
            }
        );
        assert!(demo_facts(&lines[..1]).is_err());
    }

    #[test]
    fn the_talosctl_block_is_found_and_filled() {
        let readme = "x\n```sh\ncargo xtask demo\n```\n```sh\nexport A=b\ntalosctl -n 127.0.<net>.1 -N <namespace>\n```\n";
        let block = talosctl_block(readme).unwrap();
        let facts = DemoFacts {
            namespace: "ns".into(),
            net: "7".into(),
        };
        assert_eq!(
            fill(&block, &facts),
            "export A=b\ntalosctl -n 127.0.7.1 -N ns\n"
        );
    }

    #[test]
    fn every_command_of_the_readme_is_run_or_excused() {
        let readme = std::fs::read_to_string(crate::workspace_root().join("README.md")).unwrap();
        coverage(&readme).unwrap();
        let unknown = format!("{readme}\nrun `cargo xtask frobnicate` to frob\n");
        let error = coverage(&unknown).unwrap_err().to_string();
        assert!(error.contains("cargo xtask frobnicate"), "{error}");
        let dropped = readme.replace("cargo xtask e2e --target sim", "cargo xtask e2e --target x");
        assert!(coverage(&dropped).is_err());
    }
}
