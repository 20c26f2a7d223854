//! `ichor-demo`: Ichor's main job, locally. Starts the sim target (a real management control
//! plane, five simulated Talos machines in maintenance mode, the real manager and webhook),
//! creates a TalosCluster that discovers them, approves them as a person would, and shows the
//! cluster coming up until it is Ready.
//!
//! ```text
//! ichor-demo [--until-ready] [--net 10] [--talos-version v1.14.1] [--out .ichor-demo]
//! ```
//!
//! (`ichor-demo --help` says what each one means.)

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

use ichor_api::names::conditions;
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};

/// Ichor's main job, locally: a management control plane, five simulated Talos machines in
/// maintenance mode, the real manager and webhook, and a TalosCluster that discovers them.
#[derive(Debug, clap::Parser)]
struct Options {
    /// Exit once the cluster is Ready (instead of waiting for Ctrl-C).
    #[arg(long)]
    until_ready: bool,
    /// The nodes' network: they are `127.0.<net>.1-5`.
    #[arg(long, default_value_t = 10)]
    net: u8,
    /// The Talos version the nodes run and the cluster is rendered for (v1.13.x or v1.14.x).
    #[arg(long, default_value = "v1.14.1", value_parser = talos_version)]
    talos_version: String,
    /// Where the kubeconfig and talosconfig are written.
    #[arg(long, default_value = ".ichor-demo")]
    out: PathBuf,
}

fn talos_version(text: &str) -> Result<String, String> {
    if text.starts_with("v1.13.") || text.starts_with("v1.14.") {
        Ok(text.to_owned())
    } else {
        Err("expected v1.13.x or v1.14.x".into())
    }
}

async fn run(options: Options) -> Result<(), String> {
    println!(
        "Starting a management control plane, 5 simulated Talos machines (127.0.{}.1-5, Talos {}), the webhook and the manager...",
        options.net, options.talos_version
    );
    let target = SimTarget::up(SimOptions::new(5, options.net, &options.talos_version))
        .await
        .map_err(|e| e.to_string())?;
    std::fs::create_dir_all(&options.out).map_err(|e| e.to_string())?;
    // The README's block writes the talosconfig here; one left by an earlier demo belongs to a
    // cluster that is gone, and would refuse the new one.
    let talosconfig = options.out.join("talosconfig");
    let _ = std::fs::remove_file(&talosconfig);
    let kubeconfig = options.out.join("kubeconfig");
    std::fs::write(&kubeconfig, target.kubeconfig()).map_err(|e| e.to_string())?;
    let shape = Shape {
        name: "demo".into(),
        ..Shape::new(&options.talos_version, "flannel")
    };
    specs::create_cluster(&target, &shape)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "\nCreated TalosCluster demo in namespace {}, discovering 127.0.{}.0/24 ...",
        target.namespace(),
        options.net
    );
    specs::wait_discovered(&target, 5)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "\nDiscovered, all pending: nothing is written to a machine before approval.\n{}",
        ichor_harness::table::machines(&target.client(), target.namespace())
            .await
            .0
    );
    println!(
        "Approving them as a person would (kubectl patch talosmachine ... approvalState: approved):"
    );
    specs::approve_all(&target, &shape)
        .await
        .map_err(|e| e.to_string())?;
    for (i, address) in target.node_endpoints().iter().enumerate() {
        let role = if i < shape.control_planes {
            "control plane"
        } else {
            "worker"
        };
        println!("  {address} -> {role}");
    }
    let started = Instant::now();
    let mut last = String::new();
    loop {
        let (text, ready) =
            ichor_harness::table::machines(&target.client(), target.namespace()).await;
        if text != last {
            println!(
                "\n[{:>5.1}s] {ready}/5 machines ready\n{text}",
                started.elapsed().as_secs_f64()
            );
            last = text;
        }
        if specs::cluster_condition(&target, &shape.name, conditions::READY).await {
            break;
        }
        if started.elapsed() > Duration::from_secs(300) {
            return Err("the cluster did not become Ready within 5 minutes".into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    specs::check_cluster(&target, &shape)
        .await
        .map_err(|e| e.to_string())?;
    println!(
        "\nTalosCluster demo is Ready in {:.1}s: one etcd cluster of 3 voters, 2 workers.\n\nLook around:\n  export KUBECONFIG={}\n  kubectl -n {ns} get talosclusters,talosmachines\n  kubectl -n {ns} get events\nand at the nodes with the real talosctl (built by `cargo xtask oracles`):\n  \"$(cargo xtask bins | tail -n 1)/kubectl-ichor\" talosconfig demo -n {ns} -o {talosconfig}\n  \"$(cargo xtask oracles | tail -n 1)/talosctl\" --talosconfig {talosconfig} -n {first} get members\n",
        started.elapsed().as_secs_f64(),
        kubeconfig.display(),
        ns = target.namespace(),
        talosconfig = options.out.join("talosconfig").display(),
        first = target
            .node_endpoints()
            .first()
            .map(String::as_str)
            .unwrap_or_default(),
    );
    if !options.until_ready {
        println!("Ctrl-C stops everything.");
        let _ = tokio::signal::ctrl_c().await;
    }
    target.down().await;
    let _ = std::fs::remove_file(&kubeconfig);
    let _ = std::fs::remove_file(&talosconfig);
    Ok(())
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = <Options as clap::Parser>::parse();
    match run(options).await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ichor-demo: {error}");
            ExitCode::FAILURE
        }
    }
}
