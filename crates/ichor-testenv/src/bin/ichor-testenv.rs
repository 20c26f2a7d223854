//! `ichor-testenv serve`: runs a local etcd + kube-apiserver until interrupted.
//!
//! Prints how to reach it, then a machine-readable `ICHOR_TESTENV_DIR=<folder>` line. Stops on
//! SIGINT or SIGTERM, and with `--exit-on-stdin-eof` also when its standard input closes (so the
//! process that started it takes it down by dying).
#![forbid(unsafe_code)]

use std::io::Write as _;
use std::os::unix::fs::OpenOptionsExt as _;
use std::path::PathBuf;
use std::process::ExitCode;

use ichor_testenv::{ControlPlane, SHARED_DIR_ENV};
use tokio::io::AsyncReadExt as _;
use tokio::signal::unix::{SignalKind, signal};

/// Runs a local etcd + kube-apiserver until interrupted.
#[derive(Debug, clap::Parser)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, clap::Subcommand)]
enum Command {
    /// Start the control plane and serve until SIGINT or SIGTERM.
    Serve(Args),
}

#[derive(Debug, clap::Args)]
struct Args {
    /// Also write the admin kubeconfig here (mode 0600; removed on exit).
    #[arg(long)]
    kubeconfig_out: Option<PathBuf>,
    /// Also stop when standard input closes.
    #[arg(long)]
    exit_on_stdin_eof: bool,
}

async fn stdin_closed() {
    let mut stdin = tokio::io::stdin();
    let mut buf = [0u8; 256];
    while matches!(stdin.read(&mut buf).await, Ok(n) if n > 0) {}
}

async fn serve(args: Args) -> Result<(), String> {
    let mut sigint = signal(SignalKind::interrupt()).map_err(|e| e.to_string())?;
    let mut sigterm = signal(SignalKind::terminate()).map_err(|e| e.to_string())?;
    let plane = ControlPlane::start().await.map_err(|e| {
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(&format!(": {s}"));
            source = s.source();
        }
        msg
    })?;
    let conn = plane.connection();
    let mut kubeconfig = conn.dir().join(ichor_testenv::KUBECONFIG_FILE);
    if let Some(out) = &args.kubeconfig_out {
        if let Some(parent) = out.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent)
                .map_err(|e| format!("create {}: {e}", parent.display()))?;
        }
        // The kubeconfig holds an admin key: readable by its owner only.
        let mut file = std::fs::OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .mode(0o600)
            .open(out)
            .map_err(|e| format!("write {}: {e}", out.display()))?;
        file.write_all(conn.kubeconfig().as_bytes())
            .map_err(|e| format!("write {}: {e}", out.display()))?;
        kubeconfig = out.clone();
    }
    println!("ichor-testenv: control plane ready (Ctrl-C stops it and removes its data)");
    println!("  apiserver:  {}", conn.server());
    println!("  kubeconfig: {}", kubeconfig.display());
    println!(
        "  try:        kubectl --kubeconfig {} get namespaces",
        kubeconfig.display()
    );
    println!("{SHARED_DIR_ENV}={}", conn.dir().display());
    let stdin_eof = async {
        if args.exit_on_stdin_eof {
            stdin_closed().await
        } else {
            std::future::pending().await
        }
    };
    tokio::select! {
        _ = sigint.recv() => {}
        _ = sigterm.recv() => {}
        () = stdin_eof => {}
    }
    drop(plane);
    if let Some(out) = &args.kubeconfig_out {
        let _ = std::fs::remove_file(out);
    }
    // Whoever read our output may be gone by now: a closed stdout is not a failure.
    let _ = writeln!(std::io::stdout(), "ichor-testenv: stopped");
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let Command::Serve(args) = <Cli as clap::Parser>::parse().command;
    match serve(args).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(msg) => {
            eprintln!("ichor-testenv: {msg}");
            ExitCode::FAILURE
        }
    }
}
