//! `ichor-harness`: brings an e2e target up, runs the spec set on it, and tears it down.
//!
//! ```text
//! ichor-harness up   --target sim|cluster|qemu [options]   # up; holds until SIGINT/SIGTERM, then cleans up
//! ichor-harness run  --target cluster|qemu [options]       # up, the spec set, down
//! ichor-harness down --target cluster|qemu [options]       # deletes the run's objects by name
//! ```
//!
//! SIGINT or SIGTERM at any point, even halfway through bring-up, cleans up before exiting.
//! The `cluster` target needs `KUBECONFIG` and `ICHOR_E2E_KUBE_CONTEXT` (the outer cluster,
//! never a default context); `ICHOR_E2E_PROTECTED_ADDRESSES` lists addresses never to be
//! targeted. See `docs/e2e.md`.

use std::path::PathBuf;
use std::process::ExitCode;

use ichor_harness::cluster::ClusterPlan;
use ichor_harness::cluster_target::{self, ClusterOptions, ClusterTarget};
use ichor_harness::qemu::{self, QemuOptions, QemuTarget};
use ichor_harness::rails::{self, Pinned, Protected};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use tokio::signal::unix::{SignalKind, signal};

const USAGE: &str = "usage: ichor-harness up|run|down --target sim|cluster|qemu [--talos-version V] [--nodes N] [--management 1|3] [--iso-schematic ID] [--installer-schematic ID] [--storage-class C] [--pod-subnet CIDR] [--service-subnet CIDR] [--outer-subnets CIDR,…] [--binaries DIR] [--talosctl PATH] [--workers N] [--host-address IP] [--net N] [--out DIR]";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Action {
    Up,
    Run,
    Down,
}

#[derive(Debug)]
struct Args {
    action: Action,
    target: String,
    values: std::collections::BTreeMap<String, String>,
}

impl Args {
    fn parse() -> Result<Self, String> {
        let mut args = std::env::args().skip(1);
        let action = match args.next().as_deref() {
            Some("up") => Action::Up,
            Some("run") => Action::Run,
            Some("down") => Action::Down,
            _ => return Err(USAGE.into()),
        };
        let mut values = std::collections::BTreeMap::new();
        while let Some(flag) = args.next() {
            let Some(name) = flag.strip_prefix("--") else {
                return Err(format!("unexpected argument {flag}\n{USAGE}"));
            };
            let value = args
                .next()
                .ok_or_else(|| format!("--{name} needs a value\n{USAGE}"))?;
            values.insert(name.to_owned(), value);
        }
        let target = values
            .remove("target")
            .ok_or_else(|| format!("--target is required\n{USAGE}"))?;
        Ok(Self {
            action,
            target,
            values,
        })
    }

    fn get(&self, name: &str, default: &str) -> String {
        self.values
            .get(name)
            .cloned()
            .unwrap_or_else(|| default.to_owned())
    }

    fn required(&self, name: &str) -> Result<String, String> {
        self.values
            .get(name)
            .cloned()
            .ok_or_else(|| format!("--{name} is required for the {} target", self.target))
    }

    fn number(&self, name: &str, default: usize) -> Result<usize, String> {
        self.values.get(name).map_or(Ok(default), |v| {
            v.parse()
                .map_err(|_| format!("--{name} takes a number, not {v:?}"))
        })
    }
}

fn protected() -> Result<Protected, String> {
    Protected::parse(&std::env::var(rails::PROTECTED_ENV).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", rails::PROTECTED_ENV))
}

fn cluster_options(args: &Args) -> Result<ClusterOptions, String> {
    let talos_version = args.get("talos-version", "v1.14.1");
    let plan = ClusterPlan {
        talos_version,
        iso_schematic: args.required("iso-schematic")?,
        installer_schematic: args.required("installer-schematic")?,
        nodes: args.number("nodes", 3)?,
        storage_class: args.values.get("storage-class").cloned(),
        pod_subnet: args.get("pod-subnet", "10.244.0.0/16"),
        service_subnet: args.get("service-subnet", "10.96.0.0/12"),
        outer_subnets: args
            .get("outer-subnets", "")
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    let mut options = ClusterOptions::new(plan, PathBuf::from(args.get("binaries", ".")));
    options.management = args.number("management", 1)?;
    options.protected = protected()?;
    Ok(options)
}

fn qemu_options(args: &Args) -> Result<QemuOptions, String> {
    Ok(QemuOptions {
        talosctl: PathBuf::from(args.get("talosctl", "talosctl")),
        workers: args.number("workers", 2)?,
        host_address: args
            .get("host-address", "10.5.0.1")
            .parse()
            .map_err(|_| "--host-address takes an IP address".to_owned())?,
        state: PathBuf::from(args.get("out", ".ichor-e2e/qemu")),
        protected: protected()?,
    })
}

/// The outer cluster's pinned context: refused when unset or unknown, for up and down alike.
fn pinned() -> Result<Pinned, String> {
    Pinned::from_env(|k| std::env::var(k).ok()).map_err(|e| e.to_string())
}

/// Waits for SIGINT or SIGTERM and names it.
async fn stopped() -> &'static str {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        // Without handlers, never report a signal (the default action applies).
        return std::future::pending().await;
    };
    tokio::select! {
        _ = interrupt.recv() => "SIGINT",
        _ = terminate.recv() => "SIGTERM",
    }
}

/// The spec set a real target runs: one cluster from discovery to Ready.
async fn spec_set(target: &impl Target, talos_version: &str) -> Result<(), String> {
    let nodes = target.node_endpoints().len();
    let shape = Shape {
        control_planes: 1.min(nodes),
        ..Shape::new(talos_version, "flannel")
    };
    specs::lifecycle(target, &shape)
        .await
        .map_err(|e| format!("lifecycle spec: {e}"))
}

async fn sim(args: &Args) -> Result<(), String> {
    if args.action != Action::Up {
        return Err("the sim target is only brought up here (`cargo xtask e2e --target sim` runs its specs)".into());
    }
    let net: u8 = args
        .get("net", "90")
        .parse()
        .map_err(|_| "--net takes 0-255".to_owned())?;
    let out = PathBuf::from(args.get("out", ".ichor-e2e/sim"));
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let version = args.get("talos-version", "v1.14.1");
    let signal = tokio::select! {
        target = SimTarget::up(SimOptions::new(3, net, &version)) => {
            let target = target.map_err(|e| e.to_string())?;
            let kubeconfig = out.join("kubeconfig");
            std::fs::write(&kubeconfig, target.kubeconfig()).map_err(|e| e.to_string())?;
            println!("ready: kubeconfig {} context {}", kubeconfig.display(), target.context());
            let signal = stopped().await;
            eprintln!("ichor-harness: {signal}: cleaning up");
            target.down().await;
            signal
        }
        signal = stopped() => {
            eprintln!("ichor-harness: {signal} during bring-up: cleaning up");
            signal
        }
    };
    println!("cleaned up after {signal}");
    Ok(())
}

async fn cluster(args: &Args) -> Result<(), String> {
    // The rails first: no call is made without a pinned, existing context.
    let pinned = pinned()?;
    let options = cluster_options(args)?;
    let plan = options.plan.clone();
    let cleanup = || async {
        cluster_target::down(&pinned, &plan)
            .await
            .map_err(|e| e.to_string())
    };
    if args.action == Action::Down {
        cleanup().await?;
        println!("cleaned up");
        return Ok(());
    }
    let version = plan.talos_version.clone();
    let management = options.management;
    let outcome = tokio::select! {
        result = async {
            let target = ClusterTarget::up(&pinned, options).await.map_err(|e| e.to_string())?;
            println!("ready: management cluster at {}", target.kubeconfig().lines().find(|l| l.contains("server:")).unwrap_or_default().trim());
            if args.action == Action::Run {
                spec_set(&target, &version).await?;
                for i in management..plan.nodes {
                    target.detach_iso(i).await.map_err(|e| e.to_string())?;
                }
                Ok::<_, String>(None)
            } else {
                let out = PathBuf::from(args.get("out", ".ichor-e2e/cluster"));
                std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
                std::fs::write(out.join("kubeconfig"), target.kubeconfig()).map_err(|e| e.to_string())?;
                println!("inner kubeconfig: {} (through a relay held by this process)", out.join("kubeconfig").display());
                Ok(Some(stopped().await))
            }
        } => result,
        signal = stopped() => Ok(Some(signal)),
    };
    if let Ok(Some(signal)) = &outcome {
        eprintln!("ichor-harness: {signal}: cleaning up");
    }
    let cleaned = cleanup().await;
    outcome?;
    cleaned?;
    println!("cleaned up");
    Ok(())
}

async fn qemu_target(args: &Args) -> Result<(), String> {
    let options = qemu_options(args)?;
    if args.action == Action::Down {
        qemu::down(&options).await.map_err(|e| e.to_string())?;
        println!("cleaned up");
        return Ok(());
    }
    let version = args.get("talos-version", "v1.14.1");
    let outcome = tokio::select! {
        result = async {
            let target = QemuTarget::up(options.clone()).await.map_err(|e| e.to_string())?;
            let result = if args.action == Action::Run {
                spec_set(&target, &version).await.map(|()| None)
            } else {
                println!("ready: kubeconfig {}", options.state.join("kubeconfig").display());
                Ok(Some(stopped().await))
            };
            target.down().await.map_err(|e| e.to_string())?;
            result
        } => result,
        signal = stopped() => Ok(Some(signal)),
    };
    if let Ok(Some(signal)) = &outcome {
        eprintln!("ichor-harness: {signal}: cleaning up");
    }
    // Destroying an absent cluster is harmless; run it in every case.
    let cleaned = qemu::down(&options).await.map_err(|e| e.to_string());
    outcome?;
    if let Err(e) = cleaned
        && !e.contains("not found")
    {
        eprintln!("ichor-harness: {e}");
    }
    println!("cleaned up");
    Ok(())
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() -> ExitCode {
    let args = match Args::parse() {
        Ok(args) => args,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = match args.target.as_str() {
        "sim" => sim(&args).await,
        "cluster" => cluster(&args).await,
        "qemu" => qemu_target(&args).await,
        other => Err(format!("unknown target {other:?}: sim, cluster or qemu")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ichor-harness: {e}");
            ExitCode::FAILURE
        }
    }
}
