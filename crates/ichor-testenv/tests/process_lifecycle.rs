//! The control plane's processes and folder never outlive the process that started them:
//! not when it is interrupted, and not when it is killed outright.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

const BIN: &str = env!("CARGO_BIN_EXE_ichor-testenv");

/// Starts `ichor-testenv serve` and returns it with its control plane's folder and process ids.
fn serve() -> (Child, PathBuf, Vec<i32>) {
    let mut child = Command::new(BIN)
        .arg("serve")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("start ichor-testenv");
    let stdout = child.stdout.take().expect("stdout");
    let dir = BufReader::new(stdout)
        .lines()
        .map_while(Result::ok)
        .find_map(|line| line.strip_prefix("ICHOR_TESTENV_DIR=").map(PathBuf::from))
        .expect("ichor-testenv reports its folder once ready");
    let pids = std::fs::read_to_string(dir.join(ichor_testenv::process::PGIDS_FILE))
        .expect("pgids file")
        .lines()
        .map(|l| l.trim().parse().expect("a pid"))
        .collect::<Vec<i32>>();
    assert_eq!(pids.len(), 2, "etcd and kube-apiserver");
    for pid in &pids {
        assert!(alive(*pid), "process {pid} runs while served");
    }
    (child, dir, pids)
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: i32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        // The state is the first field after the parenthesised command name.
        Ok(stat) => stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X"),
        Err(_) => false,
    }
}

fn wait_gone(pids: &[i32], dir: &Path) {
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if pids.iter().all(|p| !alive(*p)) && !dir.exists() {
            return;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let left: Vec<_> = pids.iter().filter(|p| alive(**p)).collect();
    panic!(
        "left behind: processes {left:?}, folder exists: {}",
        dir.exists()
    );
}

#[test]
fn sigkill_of_the_owner_takes_down_etcd_apiserver_and_the_folder() {
    let (mut child, dir, pids) = serve();
    child.kill().expect("SIGKILL");
    child.wait().expect("reap");
    wait_gone(&pids, &dir);
}

#[test]
fn interrupting_the_owner_stops_everything_cleanly() {
    let (mut child, dir, pids) = serve();
    let pid = Pid::from_raw(i32::try_from(child.id()).expect("pid"));
    kill(pid, Signal::SIGINT).expect("SIGINT");
    let status = child.wait().expect("reap");
    assert!(status.success(), "a graceful stop exits 0: {status}");
    wait_gone(&pids, &dir);
}

#[test]
fn serve_without_binaries_fails_with_how_to_build_them() {
    let empty = tempfile::tempdir().expect("temp dir");
    let output = Command::new(BIN)
        .arg("serve")
        .env("KUBEBUILDER_ASSETS", empty.path())
        .stdin(Stdio::null())
        .output()
        .expect("run ichor-testenv");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("cargo xtask envtest-assets"), "{stderr}");
}
