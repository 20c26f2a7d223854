//! `ichor-webhook`: the validating admission webhook server.
//!
//! Settings come from flags, else from the environment:
//!
//! | flag | env | default |
//! |---|---|---|
//! | `--namespace` | `POD_NAMESPACE` | `ichor-system` |
//! | `--service-name` | `ICHOR_WEBHOOK_SERVICE` | `ichor-webhook` |
//! | `--pod-ip` | `POD_IP` | required |
//! | `--port` | `ICHOR_WEBHOOK_PORT` | `9443` |
//! | `--secret-name` | `ICHOR_WEBHOOK_SECRET` | `ichor-webhook-server-cert` |
//! | `--webhook-configuration` | `ICHOR_WEBHOOK_CONFIGURATION` | `ichor-validating-webhook-configuration` |
//! | `--refresh-seconds` | `ICHOR_WEBHOOK_REFRESH_SECONDS` | `30` |
//! | `--leaf-validity-hours` | `ICHOR_WEBHOOK_LEAF_VALIDITY_HOURS` | `168` |
//!
//! The Kubernetes connection is the in-cluster one, or `KUBECONFIG`.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use ichor_webhook::{CERT_SECRET, CertSettings, Settings, WEBHOOK_CONFIGURATION};

struct Flags {
    args: Vec<String>,
}

impl Flags {
    /// The value of `--flag`, else of `env`, else `default`.
    fn value(&self, flag: &str, env: &str, default: Option<&str>) -> Result<String, String> {
        if let Some(i) = self.args.iter().position(|a| a == flag) {
            return self
                .args
                .get(i + 1)
                .cloned()
                .ok_or_else(|| format!("{flag} needs a value"));
        }
        if let Ok(v) = std::env::var(env)
            && !v.is_empty()
        {
            return Ok(v);
        }
        default
            .map(str::to_owned)
            .ok_or_else(|| format!("{flag} (or {env}) is required"))
    }

    fn number(&self, flag: &str, env: &str, default: &str) -> Result<u64, String> {
        let v = self.value(flag, env, Some(default))?;
        v.parse()
            .map_err(|_| format!("{flag} {v:?}: expected a whole number"))
    }
}

fn settings() -> Result<Settings, String> {
    let flags = Flags {
        args: std::env::args().skip(1).collect(),
    };
    const KNOWN: [&str; 8] = [
        "--namespace",
        "--service-name",
        "--pod-ip",
        "--port",
        "--secret-name",
        "--webhook-configuration",
        "--refresh-seconds",
        "--leaf-validity-hours",
    ];
    for (i, arg) in flags.args.iter().enumerate() {
        if i % 2 == 0 && !KNOWN.contains(&arg.as_str()) {
            return Err(format!("unknown argument {arg}"));
        }
    }
    let pod_ip_text = flags.value("--pod-ip", "POD_IP", None)?;
    let pod_ip: IpAddr = pod_ip_text
        .parse()
        .map_err(|_| format!("--pod-ip {pod_ip_text:?}: expected an IP address"))?;
    let port = u16::try_from(flags.number("--port", "ICHOR_WEBHOOK_PORT", "9443")?)
        .map_err(|_| "--port: expected a TCP port (0-65535)".to_owned())?;
    let refresh = flags.number("--refresh-seconds", "ICHOR_WEBHOOK_REFRESH_SECONDS", "30")?;
    let validity = flags.number(
        "--leaf-validity-hours",
        "ICHOR_WEBHOOK_LEAF_VALIDITY_HOURS",
        "168",
    )?;
    if refresh == 0 || validity == 0 {
        return Err("--refresh-seconds and --leaf-validity-hours must be positive".into());
    }
    let leaf_validity = Duration::from_secs(validity * 3600);
    Ok(Settings {
        bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), port),
        certs: CertSettings {
            namespace: flags.value("--namespace", "POD_NAMESPACE", Some("ichor-system"))?,
            service: flags.value(
                "--service-name",
                "ICHOR_WEBHOOK_SERVICE",
                Some("ichor-webhook"),
            )?,
            pod_ip,
            secret: flags.value("--secret-name", "ICHOR_WEBHOOK_SECRET", Some(CERT_SECRET))?,
            webhook_configuration: flags.value(
                "--webhook-configuration",
                "ICHOR_WEBHOOK_CONFIGURATION",
                Some(WEBHOOK_CONFIGURATION),
            )?,
            leaf_validity,
            renew_before: leaf_validity / 3,
        },
        refresh: Duration::from_secs(refresh),
    })
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
    let settings = match settings() {
        Ok(s) => s,
        Err(error) => {
            eprintln!("ichor-webhook: {error}");
            return ExitCode::from(2);
        }
    };
    let client = match kube::Client::try_default().await {
        Ok(c) => c,
        Err(error) => {
            eprintln!("ichor-webhook: cannot connect to Kubernetes: {error}");
            return ExitCode::FAILURE;
        }
    };
    let running = match ichor_webhook::start(client, settings).await {
        Ok(r) => r,
        Err(error) => {
            eprintln!("ichor-webhook: {error}");
            return ExitCode::FAILURE;
        }
    };
    println!("listening on {}", running.addr());
    let stop = tokio::spawn(async {
        use tokio::signal::unix::{SignalKind, signal};
        if let Ok(mut term) = signal(SignalKind::terminate()) {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        } else {
            let _ = tokio::signal::ctrl_c().await;
        }
    });
    let _ = stop.await;
    running.shutdown();
    match running.wait().await {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("ichor-webhook: {error}");
            ExitCode::FAILURE
        }
    }
}
