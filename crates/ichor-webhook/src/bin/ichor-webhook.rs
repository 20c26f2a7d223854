//! `ichor-webhook`: the validating admission webhook server. Flags and their environment
//! variables: `ichor-webhook --help`.
//!
//! SIGTERM stops it with status 0; a serving failure with status 1; bad flags with status 2.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use clap::Parser;
use ichor_webhook::{CERT_SECRET, CertSettings, ClientAuth, Settings, WEBHOOK_CONFIGURATION};

/// The Ichor validating admission webhook. The Kubernetes connection is the in-cluster one,
/// or `KUBECONFIG`; logs are JSON lines filtered by `RUST_LOG`.
#[derive(Debug, Parser)]
#[command(version)]
struct Options {
    /// Namespace of the Service and of the CA Secret.
    #[arg(long, env = "POD_NAMESPACE", default_value = "ichor-system")]
    namespace: String,
    /// The webhook's Service (the serving certificate names it).
    #[arg(long, env = "ICHOR_WEBHOOK_SERVICE", default_value = "ichor-webhook")]
    service_name: String,
    /// This replica's pod IP (the serving certificate names it).
    #[arg(long, env = "POD_IP")]
    pod_ip: IpAddr,
    /// The HTTPS port (0 picks one).
    #[arg(long, env = "ICHOR_WEBHOOK_PORT", default_value = "9443")]
    port: u16,
    /// The Secret holding the webhook's CA.
    #[arg(long, env = "ICHOR_WEBHOOK_SECRET", default_value = CERT_SECRET)]
    secret_name: String,
    /// The ValidatingWebhookConfiguration whose caBundle gets the CA.
    #[arg(long, env = "ICHOR_WEBHOOK_CONFIGURATION", default_value = WEBHOOK_CONFIGURATION)]
    webhook_configuration: String,
    /// How often the CA is re-read and the leaf checked, in seconds.
    #[arg(long, env = "ICHOR_WEBHOOK_REFRESH_SECONDS", default_value = "30", value_parser = ichor_service::positive)]
    refresh_seconds: u64,
    /// Lifetime of this replica's serving certificate, in hours (renewed with a third left).
    #[arg(long, env = "ICHOR_WEBHOOK_LEAF_VALIDITY_HOURS", default_value = "168", value_parser = ichor_service::positive)]
    leaf_validity_hours: u64,
    /// Where to serve /metrics, /healthz and /readyz over plain HTTP (HOST:PORT); none if
    /// unset.
    #[arg(long, env = "ICHOR_WEBHOOK_METRICS_ADDR")]
    metrics_addr: Option<SocketAddr>,
    /// PEM file of the CA that signed the client certificate the apiserver presents to webhooks
    /// (its admission configuration's `kubeConfigFile`). When set, `/validate` refuses any
    /// caller without a certificate of this CA; when unset, it answers whoever reaches the port.
    #[arg(long, env = "ICHOR_WEBHOOK_CLIENT_CA_FILE")]
    client_ca_file: Option<PathBuf>,
}

impl Options {
    fn settings(&self) -> Result<Settings, ichor_webhook::Error> {
        let leaf_validity = Duration::from_secs(self.leaf_validity_hours * 3600);
        let client_auth = self
            .client_ca_file
            .as_deref()
            .map(ClientAuth::from_pem_file)
            .transpose()?;
        Ok(Settings {
            bind: SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), self.port),
            certs: CertSettings {
                namespace: self.namespace.clone(),
                service: self.service_name.clone(),
                pod_ip: self.pod_ip,
                secret: self.secret_name.clone(),
                webhook_configuration: self.webhook_configuration.clone(),
                leaf_validity,
                renew_before: leaf_validity / 3,
            },
            refresh: Duration::from_secs(self.refresh_seconds),
            client_auth,
        })
    }
}

/// Why the webhook stopped before a clean shutdown.
#[derive(Debug, thiserror::Error)]
enum Failure {
    #[error("cannot connect to Kubernetes: {0}")]
    Kubernetes(#[from] kube::Error),
    #[error(transparent)]
    Webhook(#[from] ichor_webhook::Error),
    #[error("cannot serve metrics on {addr}: {source}")]
    Metrics {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

async fn run(options: Options) -> Result<(), Failure> {
    let settings = options.settings()?;
    let authenticated = settings.client_auth.is_some();
    let client = ichor_service::client().await?;
    let running = ichor_webhook::start(client, settings).await?;
    // The first line: what the harness and the tests wait for.
    println!("listening on {}", running.addr());
    if !authenticated {
        tracing::warn!(
            "no client CA (--client-ca-file): /validate answers any caller that reaches the port; restrict it with the NetworkPolicy (docs/install.md)"
        );
    }
    if let Some(addr) = options.metrics_addr {
        let health = Arc::new(ichor_service::Health::default());
        health.set_ready(true);
        let bound = ichor_service::serve(addr, running.metrics().registry(), health)
            .await
            .map_err(|source| Failure::Metrics { addr, source })?;
        println!("metrics on http://{bound}");
    }
    ichor_service::terminated().await;
    running.shutdown();
    Ok(running.wait().await?)
}

#[tokio::main]
async fn main() -> ExitCode {
    let options = Options::parse();
    ichor_service::init_tracing();
    ichor_service::exit("ichor-webhook", run(options).await)
}

#[cfg(test)]
mod tests {
    use ichor_testenv::tuning::{shown, tuning_rows};

    use super::*;

    /// The options of every flag at its default (and a Pod IP, which has none), each named on
    /// the command line so that no environment variable stands in for it.
    fn defaults() -> Options {
        use clap::CommandFactory as _;
        let command = Options::command();
        let args = command.get_arguments().filter_map(|arg| {
            let long = arg.get_long()?;
            let default = arg.get_default_values().first()?;
            Some(format!("--{long}={}", default.to_string_lossy()))
        });
        let args = ["ichor-webhook".to_owned(), "--pod-ip=10.0.0.1".to_owned()]
            .into_iter()
            .chain(args);
        Options::try_parse_from(args).expect("the defaults parse")
    }

    /// What each tuning flag sets, at its default, as `docs/tuning.md` writes it, with the key
    /// of the chart's `webhook` values that sets it and the flag's default in its own unit.
    fn tuned() -> Vec<(&'static str, &'static str, String, u64)> {
        let options = defaults();
        let settings = options.settings().expect("the defaults make settings");
        vec![
            (
                "ichor-webhook --refresh-seconds",
                "refreshSeconds",
                shown(settings.refresh),
                options.refresh_seconds,
            ),
            (
                "ichor-webhook --leaf-validity-hours",
                "leafValidityHours",
                shown(settings.certs.leaf_validity),
                options.leaf_validity_hours,
            ),
        ]
    }

    /// Every webhook flag `docs/tuning.md` names states the flag's default, and every tuning
    /// flag has its row: a default changed without the page fails.
    #[test]
    fn tuning_doc_states_each_flag_default() {
        let rows = tuning_rows();
        let defaults = tuned();
        for (flag, _, value, _) in &defaults {
            let stated = rows
                .iter()
                .find(|[named, _, _]| named == flag)
                .map(|[_, _, default]| *default);
            assert_eq!(
                stated,
                Some(value.as_str()),
                "docs/tuning.md's default of {flag}"
            );
        }
        for [named, _, _] in &rows {
            if named.starts_with("ichor-webhook ") {
                assert!(
                    defaults.iter().any(|(flag, ..)| flag == named),
                    "docs/tuning.md names {named}, which no test checks"
                );
            }
        }
    }

    /// The chart sets every tuning flag (through its environment variable) to the flag's own
    /// default, so an install gets the defaults `docs/tuning.md` states.
    #[test]
    fn chart_values_are_the_flag_defaults() {
        let chart = include_str!("../../../../charts/ichor/values.yaml");
        let chart: serde_json::Value = serde_saphyr::from_str(chart).expect("values.yaml reads");
        for (flag, key, _, default) in tuned() {
            assert_eq!(
                chart["webhook"][key].as_u64(),
                Some(default),
                "values.yaml's webhook.{key} against the default of {flag}"
            );
        }
    }
}
