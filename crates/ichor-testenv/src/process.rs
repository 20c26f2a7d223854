//! Child processes that die with their parent.
//!
//! Three layers, so that no etcd or kube-apiserver outlives the process that started it:
//!
//! 1. Every child runs in its own process group, killed as a group when dropped.
//! 2. Every child gets a parent-death signal (`setpriv --pdeathsig KILL`). The kernel sends it
//!    when the *thread* that forked the child exits, so children are forked by one dedicated
//!    thread that lives as long as the process, never by a short-lived test thread.
//! 3. A watchdog (`sh`, in a process group of its own so a terminal's Ctrl-C does not reach it)
//!    reads a pipe whose only writer is this process. When the pipe closes — on drop, or when
//!    this process dies in any way, `SIGKILL` included — it kills the recorded process groups
//!    and removes the control plane's folder.

use std::ffi::OsString;
use std::fs::{File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc;
use std::sync::{Mutex, OnceLock};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;

/// The file, inside a control plane's folder, listing the process groups the watchdog kills.
pub const PGIDS_FILE: &str = "pgids";

const WATCHDOG_SCRIPT: &str = r#"
while read -r _line; do :; done
if [ -f "$1/pgids" ]; then
  while read -r pg; do kill -9 -"$pg" 2>/dev/null; done < "$1/pgids"
fi
rm -rf "$1"
"#;

/// What to run: a program, its arguments, and the file its output goes to.
#[derive(Debug, Clone)]
pub struct ChildSpec {
    /// The executable.
    pub program: PathBuf,
    /// Its arguments.
    pub args: Vec<OsString>,
    /// Where stdout and stderr are written.
    pub log: PathBuf,
    /// Environment variables set for it (on top of this process's own).
    pub env: Vec<(OsString, OsString)>,
}

type SpawnReply = mpsc::Sender<io::Result<Child>>;

fn spawner() -> &'static Mutex<mpsc::Sender<(ChildSpec, SpawnReply)>> {
    static SPAWNER: OnceLock<Mutex<mpsc::Sender<(ChildSpec, SpawnReply)>>> = OnceLock::new();
    SPAWNER.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<(ChildSpec, SpawnReply)>();
        std::thread::Builder::new()
            .name("ichor-testenv-spawner".into())
            .spawn(move || {
                for (spec, reply) in rx {
                    let _ = reply.send(spawn_here(&spec));
                }
                // The senders live in a static, so this loop ends only with the process; the
                // parent-death signal of every child is tied to this thread.
                loop {
                    std::thread::park();
                }
            })
            .expect("spawn the ichor-testenv spawner thread");
        Mutex::new(tx)
    })
}

fn setpriv() -> Option<PathBuf> {
    ["/usr/bin/setpriv", "/bin/setpriv"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.is_file())
}

/// The Go garbage collector's target for every child (`GOGC`; a spec's own `env` overrides
/// it): the control planes' Go servers (etcd, kube-apiserver, kube-controller-manager, kwok,
/// SeaweedFS) collect a quarter as often as by default. A test run starts about 120
/// apiservers, each spending most of its 3 CPU seconds in its start and its CRDs' first
/// install, much of it in the collector; at 400 that is about a fifth less, for a peak
/// resident set of about 550 MiB against 390 MiB (docs/adr/0072).
const CHILD_GOGC: &str = "400";

fn spawn_here(spec: &ChildSpec) -> io::Result<Child> {
    let log = File::create(&spec.log)?;
    let mut cmd = match setpriv() {
        Some(setpriv) => {
            let mut cmd = Command::new(setpriv);
            cmd.args(["--pdeathsig", "KILL", "--"]).arg(&spec.program);
            cmd
        }
        None => Command::new(&spec.program),
    };
    cmd.args(&spec.args)
        .env("GOGC", CHILD_GOGC)
        .envs(spec.env.iter().cloned())
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log)
        .process_group(0);
    cmd.spawn()
}

/// A supervised child process: its own process group, killed with it on drop.
#[derive(Debug)]
pub struct Supervised {
    name: &'static str,
    child: Child,
    log: PathBuf,
}

impl Supervised {
    /// Starts `spec` from the spawner thread and records its process group in `pgids`.
    pub fn start(name: &'static str, spec: ChildSpec, pgids: &Path) -> io::Result<Self> {
        let log = spec.log.clone();
        let (reply_tx, reply_rx) = mpsc::channel();
        spawner()
            .lock()
            .map_err(|_| io::Error::other("spawner lock poisoned"))?
            .send((spec, reply_tx))
            .map_err(|_| io::Error::other("spawner thread is gone"))?;
        let child = reply_rx
            .recv()
            .map_err(|_| io::Error::other("spawner thread is gone"))??;
        let mut file = OpenOptions::new().create(true).append(true).open(pgids)?;
        writeln!(file, "{}", child.id())?;
        Ok(Self { name, child, log })
    }

    /// The process id (also its process group id).
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Returns an error describing the exit if the process has already exited.
    pub fn check_running(&mut self) -> Result<(), String> {
        match self.child.try_wait() {
            Ok(None) => Ok(()),
            Ok(Some(status)) => Err(format!(
                "{} exited early ({status}); last lines of {}:\n{}",
                self.name,
                self.log.display(),
                log_tail(&self.log, 30)
            )),
            Err(err) => Err(format!("cannot wait for {}: {err}", self.name)),
        }
    }

    /// Kills the whole process group and reaps the child.
    pub fn kill(&mut self) {
        if let Ok(pid) = i32::try_from(self.child.id()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.child.wait();
    }

    /// Stops the process and takes its group out of `pgids`, for a start that is given up and
    /// tried again: a group that no longer exists must not stay listed, since its id may be
    /// another process's by the time the watchdog kills what is listed.
    pub fn discard(mut self, pgids: &Path) -> io::Result<()> {
        self.kill();
        let gone = self.child.id().to_string();
        let kept: String = std::fs::read_to_string(pgids)?
            .lines()
            .filter(|line| line.trim() != gone)
            .map(|line| format!("{line}\n"))
            .collect();
        std::fs::write(pgids, kept)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The last `lines` lines of a log file, for error messages.
pub fn log_tail(path: &Path, lines: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let all: Vec<&str> = text.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// The watchdog of one control-plane folder; dropping it (or dying) triggers its cleanup.
#[derive(Debug)]
pub struct Watchdog {
    child: Child,
    pipe: Option<ChildStdin>,
}

impl Watchdog {
    /// Starts a watchdog for `dir`.
    pub fn start(dir: &Path) -> io::Result<Self> {
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(WATCHDOG_SCRIPT)
            .arg("ichor-testenv-watchdog")
            .arg(dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let pipe = child.stdin.take();
        Ok(Self { child, pipe })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        drop(self.pipe.take());
        let _ = self.child.wait();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_child_collects_at_the_run_s_gogc_unless_its_spec_says_otherwise() {
        let dir = tempfile::tempdir().expect("a folder");
        let gogc_of = |name: &str, env: Vec<(OsString, OsString)>| {
            let log = dir.path().join(format!("{name}.log"));
            let spec = ChildSpec {
                program: "sh".into(),
                args: vec!["-c".into(), "echo \"$GOGC\"".into()],
                log: log.clone(),
                env,
            };
            let mut child = spawn_here(&spec).expect("spawn");
            assert!(child.wait().expect("wait").success());
            std::fs::read_to_string(log)
                .expect("its log")
                .trim()
                .to_owned()
        };
        assert_eq!(gogc_of("default", Vec::new()), CHILD_GOGC);
        let own = vec![("GOGC".into(), "off".into())];
        assert_eq!(gogc_of("own", own), "off");
    }

    #[test]
    fn a_discarded_start_is_taken_out_of_the_pgids_file() {
        let dir = tempfile::tempdir().expect("a folder");
        let pgids = dir.path().join(PGIDS_FILE);
        std::fs::write(&pgids, "1\n").expect("an earlier group");
        let spec = || ChildSpec {
            program: "sleep".into(),
            args: vec!["30".into()],
            log: dir.path().join("sleep.log"),
            env: Vec::new(),
        };
        let kept = Supervised::start("kept", spec(), &pgids).expect("start");
        let given_up = Supervised::start("given up", spec(), &pgids).expect("start");
        let gone = given_up.pid();
        given_up.discard(&pgids).expect("discard");
        let listed = std::fs::read_to_string(&pgids).expect("pgids");
        assert_eq!(listed, format!("1\n{}\n", kept.pid()));
        assert!(
            !Path::new(&format!("/proc/{gone}")).exists()
                || std::fs::read_to_string(format!("/proc/{gone}/stat"))
                    .is_ok_and(|stat| stat.contains(") Z")),
            "the given-up process is stopped"
        );
    }
}
