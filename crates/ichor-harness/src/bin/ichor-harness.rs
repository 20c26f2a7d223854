//! `ichor-harness`: brings an e2e target up, runs the spec set on it, and tears it down.
//!
//! ```text
//! ichor-harness up   --target sim|cluster|qemu [options]   # up; holds until SIGINT/SIGTERM, then cleans up
//! ichor-harness run  --target cluster|qemu [options]       # up, the spec set, down
//! ichor-harness down --target cluster|qemu [options]       # deletes the run's objects by name
//! ```
//!
//! `ichor-harness --help` lists every option and the target it applies to.
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum Action {
    /// Bring the target up; hold it until SIGINT/SIGTERM, then clean up.
    Up,
    /// Bring the target up, run the spec set, bring it down (cluster and qemu).
    Run,
    /// Delete the run's objects by name (cluster and qemu).
    Down,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum TargetName {
    /// Simulated nodes and a local control plane (up only).
    Sim,
    /// A real Kubernetes cluster (`KUBECONFIG`, `ICHOR_E2E_KUBE_CONTEXT`).
    Cluster,
    /// QEMU virtual machines made by talosctl.
    Qemu,
}

/// Brings an e2e target up, runs the spec set on it, and tears it down (docs/e2e.md).
#[derive(Debug, clap::Parser)]
struct Args {
    /// What to do.
    #[arg(value_enum)]
    action: Action,
    /// The target.
    #[arg(long, value_enum)]
    target: TargetName,
    /// The Talos version of the nodes.
    #[arg(long, default_value = "v1.14.1")]
    talos_version: String,
    /// Nodes (cluster target).
    #[arg(long, default_value_t = 3)]
    nodes: usize,
    /// Management control planes, 1 or 3 (cluster target).
    #[arg(long, default_value_t = 1)]
    management: usize,
    /// The Image Factory schematic of the boot ISO (cluster target).
    #[arg(long, required_if_eq("target", "cluster"))]
    iso_schematic: Option<String>,
    /// The Image Factory schematic of the installer (cluster target).
    #[arg(long, required_if_eq("target", "cluster"))]
    installer_schematic: Option<String>,
    /// The storage class of the nodes' disks (cluster target).
    #[arg(long)]
    storage_class: Option<String>,
    /// The workload cluster's pod subnet (cluster target).
    #[arg(long, default_value = "10.244.0.0/16")]
    pod_subnet: String,
    /// The workload cluster's service subnet (cluster target).
    #[arg(long, default_value = "10.96.0.0/12")]
    service_subnet: String,
    /// The outer cluster's subnets, comma-separated (cluster target).
    #[arg(long, value_delimiter = ',')]
    outer_subnets: Vec<String>,
    /// The folder of the statically linked ichor-manager and ichor-webhook (cluster target).
    #[arg(long, default_value = ".")]
    binaries: PathBuf,
    /// The talosctl to run (qemu target).
    #[arg(long, default_value = "talosctl")]
    talosctl: PathBuf,
    /// Worker nodes (qemu target).
    #[arg(long, default_value_t = 2)]
    workers: usize,
    /// The host's address on the QEMU network (qemu target).
    #[arg(long, default_value = "10.5.0.1")]
    host_address: std::net::IpAddr,
    /// The simulated nodes' network, 127.0.<net>.x (sim target).
    #[arg(long, default_value_t = 90)]
    net: u8,
    /// Where the kubeconfig and state go [default: .ichor-e2e/<target>].
    #[arg(long)]
    out: Option<PathBuf>,
}

impl Args {
    fn out(&self, target: &str) -> PathBuf {
        self.out
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!(".ichor-e2e/{target}")))
    }
}

fn protected() -> Result<Protected, String> {
    Protected::parse(&std::env::var(rails::PROTECTED_ENV).unwrap_or_default())
        .map_err(|e| format!("{}: {e}", rails::PROTECTED_ENV))
}

fn cluster_options(args: &Args) -> Result<ClusterOptions, String> {
    let plan = ClusterPlan {
        talos_version: args.talos_version.clone(),
        iso_schematic: args.iso_schematic.clone().unwrap_or_default(),
        installer_schematic: args.installer_schematic.clone().unwrap_or_default(),
        nodes: args.nodes,
        storage_class: args.storage_class.clone(),
        pod_subnet: args.pod_subnet.clone(),
        service_subnet: args.service_subnet.clone(),
        outer_subnets: args
            .outer_subnets
            .iter()
            .map(|s| s.trim())
            .filter(|s| !s.is_empty())
            .map(str::to_owned)
            .collect(),
    };
    let mut options = ClusterOptions::new(plan, args.binaries.clone());
    options.management = args.management;
    options.protected = protected()?;
    Ok(options)
}

fn qemu_options(args: &Args) -> Result<QemuOptions, String> {
    Ok(QemuOptions {
        talosctl: args.talosctl.clone(),
        workers: args.workers,
        host_address: args.host_address,
        state: args.out("qemu"),
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
    let net = args.net;
    let out = args.out("sim");
    std::fs::create_dir_all(&out).map_err(|e| e.to_string())?;
    let version = args.talos_version.clone();
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
                let out = args.out("cluster");
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
    let version = args.talos_version.clone();
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
    let args = <Args as clap::Parser>::parse();
    let result = match args.target {
        TargetName::Sim => sim(&args).await,
        TargetName::Cluster => cluster(&args).await,
        TargetName::Qemu => qemu_target(&args).await,
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("ichor-harness: {e}");
            ExitCode::FAILURE
        }
    }
}
