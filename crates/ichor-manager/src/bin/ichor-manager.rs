//! `ichor-manager`: the controller, leader-elected.
//!
//! | flag | env | default |
//! |---|---|---|
//! | `--namespace` | `POD_NAMESPACE` | `ichor-system` (where the Lease lives) |
//! | `--identity` | `POD_NAME` | the hostname |
//! | `--metrics-addr` | `ICHOR_METRICS_ADDR` | `0.0.0.0:8080` |
//! | `--lease-name` | `ICHOR_LEASE_NAME` | `ichor-manager` |
//! | `--lease-seconds` | `ICHOR_LEASE_SECONDS` | `15` |
//! | `--sweep-timeout-ms` | `ICHOR_SWEEP_TIMEOUT_MS` | `2000` |
//! | `--requeue-ms` | `ICHOR_REQUEUE_MS` | `2000` |
//!
//! The Kubernetes connection is the in-cluster one, or `KUBECONFIG`. SIGTERM stops it
//! gracefully; losing the Lease stops it with exit status 1.

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use ichor_manager::http::Health;
use ichor_manager::leader::{self, LeaseSettings};
use ichor_manager::{Context, Metrics, Settings};

const KNOWN: [&str; 7] = [
    "--namespace",
    "--identity",
    "--metrics-addr",
    "--lease-name",
    "--lease-seconds",
    "--sweep-timeout-ms",
    "--requeue-ms",
];

fn value(args: &[String], flag: &str, env: &str, default: &str) -> Result<String, String> {
    if let Some(i) = args.iter().position(|a| a == flag) {
        return args
            .get(i + 1)
            .cloned()
            .ok_or_else(|| format!("{flag} needs a value"));
    }
    Ok(std::env::var(env)
        .ok()
        .filter(|v| !v.is_empty())
        .unwrap_or_else(|| default.to_owned()))
}

fn number(args: &[String], flag: &str, env: &str, default: &str) -> Result<u64, String> {
    let text = value(args, flag, env, default)?;
    text.parse::<u64>()
        .ok()
        .filter(|n| *n > 0)
        .ok_or_else(|| format!("{flag} {text:?}: expected a positive whole number"))
}

struct Options {
    lease: LeaseSettings,
    metrics: SocketAddr,
    settings: Settings,
}

fn options() -> Result<Options, String> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    for (i, arg) in args.iter().enumerate() {
        if i % 2 == 0 && !KNOWN.contains(&arg.as_str()) {
            return Err(format!("unknown argument {arg}"));
        }
    }
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_owned())
        .unwrap_or_else(|_| "ichor-manager".into());
    let identity = value(&args, "--identity", "POD_NAME", &hostname)?;
    let metrics_text = value(
        &args,
        "--metrics-addr",
        "ICHOR_METRICS_ADDR",
        "0.0.0.0:8080",
    )?;
    let metrics = metrics_text
        .parse()
        .map_err(|_| format!("--metrics-addr {metrics_text:?}: expected HOST:PORT"))?;
    let lease_seconds = number(&args, "--lease-seconds", "ICHOR_LEASE_SECONDS", "15")?;
    let mut settings = Settings {
        instance: identity.clone(),
        ..Settings::default()
    };
    settings.sweep.timeout = Duration::from_millis(number(
        &args,
        "--sweep-timeout-ms",
        "ICHOR_SWEEP_TIMEOUT_MS",
        "2000",
    )?);
    settings.progress_requeue =
        Duration::from_millis(number(&args, "--requeue-ms", "ICHOR_REQUEUE_MS", "2000")?);
    Ok(Options {
        lease: LeaseSettings {
            namespace: value(&args, "--namespace", "POD_NAMESPACE", "ichor-system")?,
            name: value(&args, "--lease-name", "ICHOR_LEASE_NAME", "ichor-manager")?,
            identity,
            duration: Duration::from_secs(lease_seconds),
            retry: Duration::from_secs(lease_seconds).div_f64(5.0),
        },
        metrics,
        settings,
    })
}

async fn terminated() {
    use tokio::signal::unix::{SignalKind, signal};
    if let Ok(mut term) = signal(SignalKind::terminate()) {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
    } else {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    tracing_subscriber::fmt()
        .json()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    let options = match options() {
        Ok(o) => o,
        Err(error) => {
            eprintln!("ichor-manager: {error}");
            return ExitCode::from(2);
        }
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(error) => {
            eprintln!("ichor-manager: cannot connect to Kubernetes: {error}");
            return ExitCode::FAILURE;
        }
    };
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    match ichor_manager::http::serve(options.metrics, Arc::clone(&metrics), Arc::clone(&health))
        .await
    {
        Ok(bound) => println!("metrics on http://{bound}"),
        Err(error) => {
            eprintln!(
                "ichor-manager: cannot serve metrics on {}: {error}",
                options.metrics
            );
            return ExitCode::FAILURE;
        }
    }
    health.ready.store(true, Ordering::SeqCst);
    tokio::select! {
        () = leader::acquire(&client, &options.lease) => {}
        () = terminated() => return ExitCode::SUCCESS,
    }
    health.leading.store(true, Ordering::SeqCst);
    tracing::info!(identity = %options.lease.identity, "leading");
    println!("leading as {}", options.lease.identity);
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let lease_client = client.clone();
    let lease = options.lease.clone();
    tokio::spawn(async move {
        leader::hold(&lease_client, &lease).await;
        let _ = lost_tx.send(());
    });
    let (why_tx, mut why_rx) = tokio::sync::watch::channel(false);
    let ctx = Arc::new(Context::new(client, options.settings, metrics));
    ichor_manager::run(ctx, async move {
        tokio::select! {
            () = terminated() => {}
            _ = lost_rx => { let _ = why_tx.send(true); }
        }
    })
    .await;
    if *why_rx.borrow_and_update() {
        eprintln!("ichor-manager: lost the lease; stopping");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
