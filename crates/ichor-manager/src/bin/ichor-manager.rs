//! `ichor-manager`: the controller, leader-elected. Flags and their environment variables:
//! `ichor-manager --help`.
//!
//! Every replica serves `/metrics`, `/healthz` and `/readyz` and is Ready, leader or standby;
//! only the Lease holder reconciles. `/healthz` fails once a controller stops (ADR 0049).
//! SIGTERM stops it with status 0; losing the Lease stops it with status 1; bad flags with
//! status 2.
#![warn(clippy::too_many_lines)]

use std::net::SocketAddr;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ichor_manager::infra::http::Health;
use ichor_manager::infra::leader::{self, LeaseSettings};
use ichor_manager::{Context, Metrics, Settings};

/// The Ichor controller. The Kubernetes connection is the in-cluster one, or `KUBECONFIG`;
/// logs are JSON lines filtered by `RUST_LOG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Options {
    /// Namespace of the leader-election Lease.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ichor-system")]
    namespace: String,
    /// This replica's identity in the Lease [default: the hostname].
    #[arg(long, env = "POD_NAME")]
    identity: Option<String>,
    /// Where to serve /metrics, /healthz and /readyz (HOST:PORT).
    #[arg(long, env = "ICHOR_METRICS_ADDR", default_value = "0.0.0.0:8080")]
    metrics_addr: SocketAddr,
    /// Name of the leader-election Lease.
    #[arg(long, env = "ICHOR_LEASE_NAME", default_value = "ichor-manager")]
    lease_name: String,
    /// Seconds a leader's Lease lasts without renewal (renewed every fifth of it).
    #[arg(long, env = "ICHOR_LEASE_SECONDS", default_value = "15", value_parser = ichor_service::positive)]
    lease_seconds: u64,
    /// How long a discovery sweep waits for each address, in milliseconds.
    #[arg(long, env = "ICHOR_SWEEP_TIMEOUT_MS", default_value = "2000", value_parser = ichor_service::positive)]
    sweep_timeout_ms: u64,
    /// How often an unfinished reconcile is retried, in milliseconds.
    #[arg(long, env = "ICHOR_REQUEUE_MS", default_value = "2000", value_parser = ichor_service::positive)]
    requeue_ms: u64,
    /// How long the published kubeconfig and talosconfig certificates live (`365d`, `12h`,
    /// `90s`, …); each is renewed at two thirds of it.
    #[arg(long, env = "ICHOR_CREDENTIAL_LIFETIME", default_value = "365d", value_parser = lifetime)]
    credential_lifetime: Duration,
    /// How long the certificates the manager mints for its own Talos and Kubernetes calls
    /// live; renewed at two thirds of it.
    #[arg(long, env = "ICHOR_OWN_CREDENTIAL_LIFETIME", default_value = "1h", value_parser = lifetime)]
    own_credential_lifetime: Duration,
    /// How long an install may run before the machine shows `InstallStalled`, in seconds
    /// (Talos puts no deadline on its installer).
    #[arg(long, env = "ICHOR_INSTALL_STALL_SECONDS", default_value = "1800", value_parser = ichor_service::positive)]
    install_stall_seconds: u64,
    /// How many reconciles of one kind run at once (1 to 1024): bounds the Talos connections
    /// and the memory held at once, whatever the fleet size.
    #[arg(long, env = "ICHOR_CONCURRENT_RECONCILES", default_value_t = ichor_manager::DEFAULT_CONCURRENCY, value_parser = clap::value_parser!(u16).range(1..=1024))]
    concurrent_reconciles: u16,
    /// At most how many settled machines are looked at a second (1 to 1000): a fleet of more
    /// machines than a minute of looks takes is looked at less often than every minute, so
    /// its idle cost stays bounded.
    #[arg(long, env = "ICHOR_SETTLED_LOOKS_PER_SECOND", default_value_t = ichor_manager::DEFAULT_SETTLED_LOOKS_PER_SECOND, value_parser = clap::value_parser!(u32).range(1..=1000))]
    settled_looks_per_second: u32,
}

/// Why a certificate lifetime flag cannot be used.
#[derive(Debug, thiserror::Error)]
enum BadLifetime {
    /// Not a duration.
    #[error(transparent)]
    NotADuration(#[from] ichor_api::time::InvalidDuration),
    /// Shorter than the 3 s a certificate needs to be renewed in time.
    #[error("the lifetime {0:?} is shorter than 3s")]
    TooShort(String),
}

/// A certificate lifetime: a duration of at least 3 s (`30s`, `5m`, `12h`, `365d`).
fn lifetime(text: &str) -> Result<Duration, BadLifetime> {
    let lifetime = ichor_api::time::parse_duration("the lifetime", text)?;
    if lifetime < Duration::from_secs(3) {
        return Err(BadLifetime::TooShort(text.to_owned()));
    }
    Ok(lifetime)
}

impl Options {
    fn lease(&self, identity: &str) -> LeaseSettings {
        let duration = Duration::from_secs(self.lease_seconds);
        LeaseSettings {
            namespace: self.namespace.clone(),
            name: self.lease_name.clone(),
            identity: identity.to_owned(),
            duration,
            retry: duration.div_f64(5.0),
        }
    }

    fn settings(&self, identity: &str) -> Settings {
        let mut settings = Settings {
            instance: identity.to_owned(),
            ..Settings::default()
        };
        settings.sweep.timeout = Duration::from_millis(self.sweep_timeout_ms);
        settings.progress_requeue = Duration::from_millis(self.requeue_ms);
        settings.credential_lifetime = self.credential_lifetime;
        settings.own_credential_lifetime = self.own_credential_lifetime;
        settings.install_stall_limit = Duration::from_secs(self.install_stall_seconds);
        settings.concurrency = self.concurrent_reconciles;
        settings.settled_looks_per_second = self.settled_looks_per_second;
        settings
    }
}

/// Why the manager stopped before a clean shutdown.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("cannot connect to Kubernetes: {0}")]
    Kubernetes(#[from] kube::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("lost the lease; stopping")]
    LostLease,
}

async fn run(options: Options) -> Result<(), Failure> {
    let identity = options
        .identity
        .clone()
        .filter(|i| !i.is_empty())
        .unwrap_or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .map(|h| h.trim().to_owned())
                .unwrap_or_else(|_| "ichor-manager".into())
        });
    let lease = options.lease(&identity);
    let client = ichor_service::client().await?;
    let metrics = Arc::new(Metrics::default());
    let health = Arc::new(Health::default());
    let bound = ichor_manager::infra::http::serve(
        options.metrics_addr,
        Arc::clone(&metrics),
        Arc::clone(&health),
    )
    .await
    .map_err(|source| Failure::Metrics {
        addr: options.metrics_addr,
        source,
    })?;
    println!("metrics on http://{bound}");
    // Ready as a standby already: readiness says the replica works, not that it leads.
    health.set_ready(true);
    tokio::select! {
        () = leader::acquire(&client, &lease) => {}
        () = ichor_service::terminated() => return Ok(()),
    }
    metrics.set_leading(true);
    tracing::info!(identity = %lease.identity, "leading");
    println!("leading as {}", lease.identity);
    let (lost_tx, lost_rx) = tokio::sync::oneshot::channel::<()>();
    let lease_client = client.clone();
    let held = lease.clone();
    tokio::spawn(async move {
        leader::hold(&lease_client, &held).await;
        let _ = lost_tx.send(());
    });
    // A controller that stops fails /healthz, so that Kubernetes restarts the manager.
    let ctx = Arc::new(
        Context::new(client, options.settings(&identity), Arc::clone(&metrics))
            .with_health(Arc::clone(&health)),
    );
    // A termination signal drains in-flight reconciles; a lost lease does not: they are
    // dropped at once, before another replica may lead (leader::renewal_overdue), and the
    // process exits.
    let run = ichor_manager::run(ctx, ichor_service::terminated());
    tokio::select! {
        () = run => {
            metrics.set_leading(false);
            Ok(())
        }
        _ = lost_rx => {
            metrics.set_leading(false);
            Err(Failure::LostLease)
        }
    }
}

/// Each runtime thread's stack (ADR 0078): a machine's reconcile nests a dozen async calls, and
/// an unoptimized build's frames (a TalosCluster's deserialization through its flattened
/// status groups above all) came within a few kilobytes of the 2 MiB default.
const THREAD_STACK: usize = 8 << 20;

fn main() -> ExitCode {
    let options = Options::parse();
    ichor_service::init_tracing();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_stack_size(THREAD_STACK)
        .build();
    match runtime {
        Ok(runtime) => ichor_service::exit("ichor-manager", runtime.block_on(run(options))),
        Err(error) => {
            eprintln!("ichor-manager: cannot start its runtime: {error}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use clap::CommandFactory as _;

    use super::*;

    use ichor_testenv::tuning::{shown, tuning_rows};

    /// What each tuning flag sets in `options`, as `docs/tuning.md` writes it.
    fn tuned(options: &Options) -> Vec<(&'static str, String)> {
        let settings = options.settings("test");
        vec![
            ("--lease-seconds", shown(options.lease("test").duration)),
            ("--sweep-timeout-ms", shown(settings.sweep.timeout)),
            ("--requeue-ms", shown(settings.progress_requeue)),
            ("--credential-lifetime", shown(settings.credential_lifetime)),
            (
                "--own-credential-lifetime",
                shown(settings.own_credential_lifetime),
            ),
            (
                "--install-stall-seconds",
                shown(settings.install_stall_limit),
            ),
            ("--concurrent-reconciles", settings.concurrency.to_string()),
            (
                "--settled-looks-per-second",
                settings.settled_looks_per_second.to_string(),
            ),
        ]
    }

    /// The options of every flag at its default but those `given` (by long name), each named on
    /// the command line so that no environment variable stands in for it.
    fn parsed(given: &BTreeMap<String, String>) -> Options {
        let command = Options::command();
        let args = command.get_arguments().filter_map(|arg| {
            let long = arg.get_long()?;
            let default = arg.get_default_values().first();
            let value = given
                .get(long)
                .cloned()
                .or_else(|| Some(default?.to_string_lossy().into_owned()))?;
            Some(format!("--{long}={value}"))
        });
        let args = std::iter::once("ichor-manager".to_owned()).chain(args);
        Options::try_parse_from(args).expect("the flags parse")
    }

    /// Every manager flag `docs/tuning.md` names states the flag's default, and every tuning
    /// flag has its row: a default changed without the page fails.
    #[test]
    fn tuning_doc_states_each_flag_default() {
        let rows: Vec<(&str, &str)> = tuning_rows()
            .into_iter()
            .filter(|[flag, _, _]| flag.starts_with("--"))
            .map(|[flag, _, default]| (flag, default))
            .collect();
        let defaults = tuned(&parsed(&BTreeMap::new()));
        for (flag, value) in &defaults {
            let stated = rows
                .iter()
                .find(|(named, _)| named == flag)
                .map(|row| row.1);
            assert_eq!(
                stated,
                Some(value.as_str()),
                "docs/tuning.md's default of {flag}"
            );
        }
        for (named, _) in &rows {
            let checked = defaults.iter().any(|(flag, _)| flag == named);
            assert!(
                checked,
                "docs/tuning.md names {named}, which no test checks"
            );
        }
    }

    /// The chart sets every tuning flag (through its environment variable) to the flag's own
    /// default, so an install gets the defaults `docs/tuning.md` states.
    #[test]
    fn chart_values_are_the_flag_defaults() {
        let chart = include_str!("../../../../charts/ichor/values.yaml");
        let chart: serde_json::Value = serde_saphyr::from_str(chart).expect("values.yaml reads");
        let defaults = tuned(&parsed(&BTreeMap::new()));
        let given: BTreeMap<String, String> = defaults
            .iter()
            .map(|(flag, _)| {
                let long = flag.trim_start_matches("--");
                let key: String = long
                    .split('-')
                    .enumerate()
                    .map(|(i, w)| {
                        if i == 0 {
                            w.to_owned()
                        } else {
                            w[..1].to_uppercase() + &w[1..]
                        }
                    })
                    .collect();
                let value = match &chart["manager"][&key] {
                    serde_json::Value::String(text) => text.clone(),
                    serde_json::Value::Number(number) => number.to_string(),
                    other => panic!("values.yaml's manager.{key} is {other}"),
                };
                (long.to_owned(), value)
            })
            .collect();
        assert_eq!(
            tuned(&parsed(&given)),
            defaults,
            "the chart's values: {given:?}"
        );
    }
}
