//! The `qemu` target: `talosctl cluster create qemu` on a runner with KVM and root. The
//! provisioned cluster (one control plane) is the management cluster; its workers are reset
//! back to maintenance mode for the specs, and Ichor's manager and webhook run as processes on
//! the runner, which reaches the VMs' bridge network directly.
//!
//! The cluster's name is fixed (`ichor-e2e`): one run at a time per runner.
//!
//! UNVERIFIED: the output format of `talosctl cluster show` (a table with `NAME`, `TYPE` and
//! `IP` columns, type `worker` for workers) was not checked against a real run here; the
//! discovery below fails loudly when it finds no worker rather than guessing addresses. Whether
//! the QEMU provisioner re-injects a config into a reset worker at its next boot is also
//! unverified: the reset worker is checked to answer in maintenance mode before the specs run.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_api::admission;
use tokio::process::Child;

use crate::cluster_target::{
    INNER_SYSTEM_NAMESPACE, client_from, eventually, install_ichor, register_webhook,
    rewrite_kubeconfig, service_account_token,
};
use crate::rails::{self, E2E_NAMESPACE, Protected, RailError};
use crate::{Capabilities, Error, Target};

/// The provisioned cluster's name.
pub const CLUSTER_NAME: &str = "ichor-e2e";
/// The webhook's port on the runner.
pub const WEBHOOK_PORT: u16 = 9443;

/// How a `qemu` run is set up.
#[derive(Debug, Clone)]
pub struct QemuOptions {
    /// The `talosctl` binary.
    pub talosctl: PathBuf,
    /// How many workers are provisioned (all reset to maintenance for the specs).
    pub workers: usize,
    /// The runner's address on the VMs' network (the webhook listens there).
    pub host_address: IpAddr,
    /// Where the run keeps its talosconfig and kubeconfigs.
    pub state: PathBuf,
    /// Addresses never targeted.
    pub protected: Protected,
}

fn rail(error: RailError) -> Error {
    Error::Spec(error.to_string())
}

/// The `talosctl cluster create qemu` arguments.
pub fn create_args(options: &QemuOptions) -> Vec<String> {
    vec![
        "cluster".into(),
        "create".into(),
        "qemu".into(),
        "--name".into(),
        CLUSTER_NAME.into(),
        "--controlplanes".into(),
        "1".into(),
        "--workers".into(),
        options.workers.to_string(),
        "--talosconfig".into(),
        options.state.join("talosconfig").display().to_string(),
    ]
}

/// The workers' addresses in `talosctl cluster show` output. UNVERIFIED format (see the module
/// docs): fails when the table has no `TYPE`/`IP` columns or lists no worker.
pub fn worker_addresses(show: &str) -> Result<Vec<IpAddr>, Error> {
    let unverified = |why: &str| {
        Error::Spec(format!(
            "cannot find the workers in `talosctl cluster show` ({why}); this parsing is unverified, so nothing is guessed:\n{show}"
        ))
    };
    let mut lines = show.lines().skip_while(|l| {
        let words: Vec<&str> = l.split_whitespace().collect();
        !(words.contains(&"TYPE") && words.contains(&"IP"))
    });
    let header: Vec<&str> = lines
        .next()
        .ok_or_else(|| unverified("no header with TYPE and IP"))?
        .split_whitespace()
        .collect();
    let kind = header.iter().position(|c| *c == "TYPE").unwrap_or(0);
    let ip = header.iter().position(|c| *c == "IP").unwrap_or(0);
    let workers: Vec<IpAddr> = lines
        .map(|l| l.split_whitespace().collect::<Vec<_>>())
        .filter(|w| {
            w.get(kind)
                .is_some_and(|k| k.eq_ignore_ascii_case("worker"))
        })
        .filter_map(|w| w.get(ip).and_then(|a| a.parse().ok()))
        .collect();
    if workers.is_empty() {
        return Err(unverified("no worker rows"));
    }
    Ok(workers)
}

/// The control plane's address in the same output (type `controlplane`).
pub fn control_plane_address(show: &str) -> Result<IpAddr, Error> {
    let rows: Vec<Vec<&str>> = show
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    rows.iter()
        .find_map(|w| {
            let at = w
                .iter()
                .position(|c| c.eq_ignore_ascii_case("controlplane"))?;
            w.get(at + 1)?.parse().ok()
        })
        .ok_or_else(|| {
            Error::Spec(format!(
                "no controlplane row in `talosctl cluster show` (unverified format):\n{show}"
            ))
        })
}

/// Arguments that return `worker` to maintenance mode: a reset naming `STATE` and `EPHEMERAL`
/// explicitly, with a reboot (talos-facts §8.4), through the control plane as endpoint.
pub fn reset_args(worker: IpAddr, endpoint: IpAddr, talosconfig: &Path) -> Vec<String> {
    vec![
        "--talosconfig".into(),
        talosconfig.display().to_string(),
        "--nodes".into(),
        worker.to_string(),
        "--endpoints".into(),
        endpoint.to_string(),
        "reset".into(),
        "--graceful=false".into(),
        "--reboot".into(),
        "--system-labels-to-wipe".into(),
        "STATE".into(),
        "--system-labels-to-wipe".into(),
        "EPHEMERAL".into(),
    ]
}

async fn talosctl(options: &QemuOptions, args: &[String]) -> Result<String, Error> {
    let mut command = rails::command(&options.talosctl).map_err(rail)?;
    command.args(args);
    let output = tokio::process::Command::from(command).output().await?;
    if !output.status.success() {
        return Err(Error::Spec(format!(
            "talosctl {} failed: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        )));
    }
    Ok(String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The `qemu` target, up.
pub struct QemuTarget {
    options: QemuOptions,
    workers: Vec<IpAddr>,
    kubeconfig: String,
    client: kube::Client,
    processes: Vec<Child>,
}

impl std::fmt::Debug for QemuTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("QemuTarget")
            .field("workers", &self.workers)
            .finish_non_exhaustive()
    }
}

impl QemuTarget {
    /// Provisions the cluster, resets its workers to maintenance, installs Ichor on it and
    /// starts the manager and webhook. On failure the caller runs [`down`].
    pub async fn up(options: QemuOptions) -> Result<Self, Error> {
        std::fs::create_dir_all(&options.state)?;
        talosctl(&options, &create_args(&options)).await?;
        let show = talosctl(
            &options,
            &[
                "cluster".into(),
                "show".into(),
                "--name".into(),
                CLUSTER_NAME.into(),
            ],
        )
        .await?;
        let control_plane = control_plane_address(&show)?;
        let workers = worker_addresses(&show)?;
        for address in std::iter::once(control_plane).chain(workers.iter().copied()) {
            options
                .protected
                .talos_target(Some(&address.to_string()))
                .map_err(rail)?;
        }
        let talosconfig = options.state.join("talosconfig");
        for worker in &workers {
            talosctl(&options, &reset_args(*worker, control_plane, &talosconfig)).await?;
        }
        // Back in maintenance: the insecure API answers on each worker.
        for worker in &workers {
            eventually(
                &format!("{worker} in maintenance"),
                Duration::from_secs(600),
                || async {
                    let args = [
                        "--nodes".to_owned(),
                        worker.to_string(),
                        "--endpoints".to_owned(),
                        worker.to_string(),
                        "get".to_owned(),
                        "disks".to_owned(),
                        "--insecure".to_owned(),
                    ];
                    Ok(talosctl(&options, &args).await.ok().map(|_| ()))
                },
            )
            .await?;
        }
        let kubeconfig_path = options.state.join("kubeconfig");
        talosctl(
            &options,
            &[
                "--talosconfig".into(),
                talosconfig.display().to_string(),
                "--nodes".into(),
                control_plane.to_string(),
                "--endpoints".into(),
                control_plane.to_string(),
                "kubeconfig".into(),
                "--force".into(),
                "--merge=false".into(),
                kubeconfig_path.display().to_string(),
            ],
        )
        .await?;
        let kubeconfig = std::fs::read_to_string(&kubeconfig_path)?;
        let client = client_from(&kubeconfig).await?;
        install_ichor(&client).await?;

        let server = format!("https://{control_plane}:6443");
        let mut processes = Vec::new();
        let webhook_kubeconfig = options.state.join("webhook.kubeconfig");
        let token = service_account_token(&client, admission::WEBHOOK_NAME).await?;
        std::fs::write(
            &webhook_kubeconfig,
            rewrite_kubeconfig(&kubeconfig, &server, None, Some(&token))?,
        )?;
        let (webhook, _) = crate::sim::spawn(
            crate::binary("ichor-webhook")?,
            &[
                "--namespace".into(),
                INNER_SYSTEM_NAMESPACE.into(),
                "--pod-ip".into(),
                options.host_address.to_string(),
                "--port".into(),
                WEBHOOK_PORT.to_string(),
            ],
            &webhook_kubeconfig,
            "listening on",
            None,
            None,
        )
        .await?;
        processes.push(webhook);
        register_webhook(
            &client,
            &format!(
                "https://{}:{WEBHOOK_PORT}{}",
                options.host_address,
                admission::WEBHOOK_PATH
            ),
        )
        .await?;
        let manager_kubeconfig = options.state.join("manager.kubeconfig");
        let token = service_account_token(&client, admission::MANAGER_NAME).await?;
        std::fs::write(
            &manager_kubeconfig,
            rewrite_kubeconfig(&kubeconfig, &server, None, Some(&token))?,
        )?;
        let (manager, _) = crate::sim::spawn(
            crate::binary("ichor-manager")?,
            &[
                "--namespace".into(),
                INNER_SYSTEM_NAMESPACE.into(),
                "--identity".into(),
                "ichor-e2e".into(),
                "--metrics-addr".into(),
                "127.0.0.1:0".into(),
            ],
            &manager_kubeconfig,
            "metrics on",
            None,
            None,
        )
        .await?;
        processes.push(manager);
        Ok(Self {
            options,
            workers,
            kubeconfig,
            client,
            processes,
        })
    }

    /// Stops the processes and destroys the cluster.
    pub async fn down(mut self) -> Result<(), Error> {
        for mut process in self.processes.drain(..) {
            let _ = process.kill().await;
        }
        down(&self.options).await
    }
}

/// Destroys the provisioned cluster (by its fixed name).
pub async fn down(options: &QemuOptions) -> Result<(), Error> {
    talosctl(
        options,
        &[
            "cluster".into(),
            "destroy".into(),
            "--name".into(),
            CLUSTER_NAME.into(),
        ],
    )
    .await
    .map(|_| ())
}

impl Target for QemuTarget {
    fn kubeconfig(&self) -> &str {
        &self.kubeconfig
    }

    fn context(&self) -> &str {
        "admin@ichor-e2e"
    }

    fn node_endpoints(&self) -> Vec<String> {
        self.workers.iter().map(ToString::to_string).collect()
    }

    fn capabilities(&self) -> Capabilities {
        Capabilities {
            faults: false,
            kill_points: false,
        }
    }

    fn namespace(&self) -> &str {
        E2E_NAMESPACE
    }

    fn client(&self) -> kube::Client {
        self.client.clone()
    }

    async fn kubelets_registered(&self, _cluster: &str) -> Result<(), Error> {
        // Real kubelets register their Nodes themselves.
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn worker_discovery_fails_loudly_when_it_finds_nothing() {
        let show = "PROVISIONER           qemu\nNAME                  ichor-e2e\n\nNODES:\n\nNAME                       TYPE           IP         CPU    RAM      DISK\nichor-e2e-controlplane-1   controlplane   10.5.0.2   2.00   2.1 GB   6.4 GB\nichor-e2e-worker-1         worker         10.5.0.3   2.00   2.1 GB   6.4 GB\n";
        assert_eq!(
            worker_addresses(show).expect("workers"),
            vec!["10.5.0.3".parse::<IpAddr>().expect("ip")]
        );
        assert_eq!(
            control_plane_address(show).expect("cp").to_string(),
            "10.5.0.2"
        );
        let none = "NAME   TYPE   IP\nichor-e2e-controlplane-1   controlplane   10.5.0.2\n";
        assert!(
            worker_addresses(none)
                .expect_err("no workers")
                .to_string()
                .contains("unverified")
        );
        assert!(worker_addresses("something else entirely").is_err());
    }

    #[test]
    fn a_reset_names_state_and_ephemeral_and_reboots() {
        let args = reset_args(
            "10.5.0.3".parse().expect("ip"),
            "10.5.0.2".parse().expect("ip"),
            Path::new("/tmp/talosconfig"),
        );
        let text = args.join(" ");
        assert!(text.contains("--nodes 10.5.0.3"));
        assert!(text.contains("--system-labels-to-wipe STATE --system-labels-to-wipe EPHEMERAL"));
        assert!(text.contains("--reboot"));
        let create = create_args(&QemuOptions {
            talosctl: "talosctl".into(),
            workers: 2,
            host_address: "10.5.0.1".parse().expect("ip"),
            state: "/tmp/state".into(),
            protected: Protected::default(),
        })
        .join(" ");
        assert!(create.starts_with("cluster create qemu --name ichor-e2e"));
    }
}
