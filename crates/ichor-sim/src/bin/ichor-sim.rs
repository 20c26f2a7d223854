//! `ichor-sim`: runs simulated Talos nodes for the local demo and end-to-end tests, each on
//! its own loopback address at port 50000, with a small HTTP control endpoint for faults and
//! gates.
//!
//! ```text
//! ichor-sim --nodes 3 --base 127.0.10.1 --talos-version v1.14.1 [--port 50000]
//!           [--control 127.0.0.1:20080] [--factory 127.0.0.1:20081] [--etcd-size 4MiB]
//!           [--bmc-port 8443 [--bmc-username admin] [--bmc-powered-off]]
//! ```
//!
//! (`ichor-sim --help` describes each.)
//!
//! `--etcd-size` is about how large the etcd database of a cluster these nodes bootstrap is
//! (its simulated Kubernetes keyspace, and so its snapshots): bytes, or with a `KiB`, `MiB`
//! or `GiB` suffix.
//!
//! `--factory` is where the nodes' Image Factory serves its schematic API (`POST /schematics`,
//! `GET /schematics/{id}`; `ichor_sim::SimFactory`): its URL is what `spec.imageFactory.url`
//! names, and its installers are what the nodes pull. It is printed after the control
//! endpoint, as `factory http://<addr>`.
//!
//! `--bmc-port` gives every node a Redfish BMC (`ichor_sim::SimBmc`, ADR 0080) on the node's
//! own address at that port, over HTTPS with a CA of its own, whose account is
//! `--bmc-username` with the password in `ICHOR_SIM_BMC_PASSWORD` (never a flag, which `ps`
//! would show). Each node's line then ends with `bmc https://<ip>:<port>`; with
//! `--bmc-powered-off` every machine starts off, known only by its BMC.
//!
//! Control endpoint (JSON):
//! - `GET  /nodes` — address, UUID, fingerprint, version, serving, stage, BMC URL of every
//!   node, and
//!   `etcd_keys`: the keys of its etcd cluster's keyspace (null without a member), and `rpcs`:
//!   how many Talos API calls arrived at it since it started;
//! - `POST /nodes/{ip}/{action}` with `action` one of `crash`, `restart`, `reboot`,
//!   `partition` (the node answers no one, peers included), `partition-from-clients` (the
//!   network between the node and every client is cut; its peers still reach it), `heal` (ends
//!   either), `cni-present`, `cni-absent`, `different-certificate`,
//!   `mismatched-key`, `fail-leave`, `succeed-leave`, `etcd-unhealthy`, `etcd-healthy`,
//!   `upgrade-rollback`, `upgrade-forward`, `require-reboot`, `apply-live`, `install-fails`,
//!   `install-succeeds`, `install-hangs`, `install-unhangs`, `disks-detached`, `disks-attached`,
//!   `slow?ms=N`, or `etcd-size?bytes=SIZE` (the node's etcd cluster grows or shrinks);
//! - `POST /nodes/{ip}/gates/{method}` holds a method, `GET` reports how many calls arrived,
//!   `DELETE` releases it;
//! - `GET  /nodes/{ip}/bmc-ca` — the PEM of the CA its BMC's certificate chains to (text).

use std::collections::BTreeMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use ichor_sim::{BmcSpec, Fault, Gate, Hardware, NodeSpec, SimFactory, SimNode};
use serde::Serialize;
use tokio::sync::Mutex;

/// Simulated Talos nodes, each on its own loopback address, with an HTTP control endpoint
/// for faults and gates.
#[derive(Debug, clap::Parser)]
struct Options {
    /// How many nodes (1 to 1024).
    #[arg(long, value_parser = node_count)]
    nodes: u32,
    /// The first node's IPv4 address (the others follow it), e.g. 127.0.10.1.
    #[arg(long)]
    base: Ipv4Addr,
    /// The Talos version the nodes run (v1.13.x or v1.14.x).
    #[arg(long, value_parser = talos_version)]
    talos_version: String,
    /// The Talos API port of every node.
    #[arg(long, default_value_t = 50000)]
    port: u16,
    /// Where the HTTP control endpoint listens. The default port lies below Linux's ephemeral
    /// range (32768-60999), where an outgoing connection to anything on 127.0.0.1 could hold
    /// it at the moment the simulator starts.
    #[arg(long, default_value = "127.0.0.1:20080")]
    control: SocketAddr,
    /// Where the nodes' simulated Image Factory serves its schematic API (below the ephemeral
    /// range, as the control endpoint).
    #[arg(long, default_value = "127.0.0.1:20081")]
    factory: SocketAddr,
    /// The etcd database size of a cluster these nodes bootstrap: bytes, or N with KiB, MiB or
    /// GiB [default: 4MiB].
    #[arg(long, value_parser = etcd_size)]
    etcd_size: Option<u64>,
    /// Give every node a Redfish BMC on its own address at this port (its password from
    /// ICHOR_SIM_BMC_PASSWORD).
    #[arg(long)]
    bmc_port: Option<u16>,
    /// The BMC account's user name.
    #[arg(long, default_value = "admin", requires = "bmc_port")]
    bmc_username: String,
    /// The BMC account's password (with --bmc-port).
    #[arg(long = "bmc-password", env = BMC_PASSWORD_ENV, hide = true, hide_env_values = true)]
    bmc_password: Option<String>,
    /// Every machine starts powered off, known only by its BMC (with --bmc-port).
    #[arg(long, requires = "bmc_port")]
    bmc_powered_off: bool,
}

/// Names the BMC account's password.
const BMC_PASSWORD_ENV: &str = "ICHOR_SIM_BMC_PASSWORD";

/// The BMC of the node at `ip`, as the options ask (`None`: no `--bmc-port`).
fn bmc_spec(options: &Options, ip: Ipv4Addr) -> Result<Option<BmcSpec>, String> {
    let Some(port) = options.bmc_port else {
        return Ok(None);
    };
    let password = options
        .bmc_password
        .as_deref()
        .filter(|p| !p.is_empty())
        .ok_or_else(|| format!("--bmc-port needs the BMC password in {BMC_PASSWORD_ENV}"))?;
    Ok(Some(BmcSpec {
        addr: SocketAddr::from((ip, port)),
        powered_off: options.bmc_powered_off,
        ..BmcSpec::new(&options.bmc_username, password)
    }))
}

fn node_count(text: &str) -> Result<u32, String> {
    text.parse::<u32>()
        .ok()
        .filter(|n| (1..=1024).contains(n))
        .ok_or_else(|| "--nodes takes a number from 1 to 1024".into())
}

fn talos_version(text: &str) -> Result<String, String> {
    if text.starts_with("v1.13.") || text.starts_with("v1.14.") {
        Ok(text.to_owned())
    } else {
        Err("the simulator models v1.13.x and v1.14.x".into())
    }
}

fn etcd_size(text: &str) -> Result<u64, String> {
    parse_size(text).ok_or_else(|| "expected bytes, or N with KiB, MiB or GiB".into())
}

/// A size: bytes, or a number with a `KiB`, `MiB` or `GiB` suffix.
fn parse_size(text: &str) -> Option<u64> {
    let (number, unit) = match text.find(|c: char| !c.is_ascii_digit()) {
        Some(at) => text.split_at(at),
        None => (text, ""),
    };
    let shift = match unit {
        "" => 0,
        "KiB" => 10,
        "MiB" => 20,
        "GiB" => 30,
        _ => return None,
    };
    number.parse::<u64>().ok()?.checked_mul(1 << shift)
}

/// The running nodes by IP, and the gates held through the control endpoint.
struct Sim {
    nodes: BTreeMap<String, SimNode>,
    gates: Mutex<BTreeMap<(String, String), Gate>>,
}

type Shared = Arc<Sim>;

#[derive(Serialize)]
struct NodeView {
    addr: String,
    uuid: String,
    fingerprint: String,
    version: String,
    serving: bool,
    stage: String,
    etcd_keys: Option<usize>,
    /// How many Talos API calls arrived at the node since it started.
    rpcs: usize,
    /// Its BMC's Redfish URL, if it has one.
    bmc: Option<String>,
}

async fn list(State(sim): State<Shared>) -> Json<Vec<NodeView>> {
    let mut out = Vec::new();
    for node in sim.nodes.values() {
        out.push(NodeView {
            addr: node.addr().to_string(),
            uuid: node.hardware().uuid.clone(),
            fingerprint: node.fingerprint(),
            version: node.talos_version(),
            serving: node.is_serving().await,
            stage: format!("{:?}", node.stage().await),
            etcd_keys: node.etcd_keys().await,
            rpcs: node.rpcs(),
            bmc: node.bmc().map(ichor_sim::SimBmc::url),
        });
    }
    Json(out)
}

type Answer = (StatusCode, Json<serde_json::Value>);

fn answer(result: Result<String, String>) -> Answer {
    match result {
        Ok(fingerprint) => (
            StatusCode::OK,
            Json(serde_json::json!({"fingerprint": fingerprint})),
        ),
        Err(error) => (
            StatusCode::BAD_REQUEST,
            Json(serde_json::json!({"error": error})),
        ),
    }
}

async fn act(
    State(sim): State<Shared>,
    Path((ip, action)): Path<(String, String)>,
    Query(query): Query<BTreeMap<String, String>>,
) -> Answer {
    let Some(node) = sim.nodes.get(&ip) else {
        return answer(Err(format!("no simulated node at {ip}")));
    };
    let fault = match action.as_str() {
        "crash" => {
            node.crash().await;
            return answer(Ok(node.fingerprint()));
        }
        "restart" | "reboot" => {
            return answer(
                node.restart()
                    .await
                    .map(|()| node.fingerprint())
                    .map_err(|e| e.to_string()),
            );
        }
        "cni-present" | "cni-absent" => {
            return answer(
                node.set_cni(action == "cni-present")
                    .await
                    .map(|()| node.fingerprint())
                    .map_err(|e| e.to_string()),
            );
        }
        "etcd-size" => {
            let Some(bytes) = query.get("bytes").and_then(|b| parse_size(b)) else {
                return answer(Err("etcd-size needs ?bytes=<size>".into()));
            };
            return answer(
                node.set_etcd_size(bytes)
                    .await
                    .map(|()| node.fingerprint())
                    .map_err(|e| e.to_string()),
            );
        }
        "partition" => Fault::Partition,
        "partition-from-clients" => Fault::PartitionFromClients,
        "heal" => Fault::Heal,
        "different-certificate" => Fault::DifferentCertificate,
        "mismatched-key" => Fault::MismatchedKey,
        "fail-leave" => Fault::FailEtcdLeave(true),
        "succeed-leave" => Fault::FailEtcdLeave(false),
        "etcd-unhealthy" => Fault::EtcdUnhealthy(true),
        "etcd-healthy" => Fault::EtcdUnhealthy(false),
        "upgrade-rollback" => Fault::UpgradeRollback(true),
        "upgrade-forward" => Fault::UpgradeRollback(false),
        "require-reboot" => Fault::RequireReboot(true),
        "apply-live" => Fault::RequireReboot(false),
        "install-fails" => Fault::InstallFails(true),
        "install-succeeds" => Fault::InstallFails(false),
        "install-hangs" => Fault::InstallHangs(true),
        "install-unhangs" => Fault::InstallHangs(false),
        "disks-detached" => Fault::DisksDetached(true),
        "disks-attached" => Fault::DisksDetached(false),
        "slow" => match query.get("ms").and_then(|ms| ms.parse::<u64>().ok()) {
            Some(ms) => Fault::Slow(Duration::from_millis(ms)),
            None => return answer(Err("slow needs ?ms=<milliseconds>".into())),
        },
        other => return answer(Err(format!("unknown action {other}"))),
    };
    answer(node.inject(fault).await.map_err(|e| e.to_string()))
}

async fn hold(State(sim): State<Shared>, Path((ip, method)): Path<(String, String)>) -> Answer {
    let Some(node) = sim.nodes.get(&ip) else {
        return answer(Err(format!("no simulated node at {ip}")));
    };
    let gate = node.gate(&method);
    sim.gates.lock().await.insert((ip, method), gate);
    (StatusCode::OK, Json(serde_json::json!({"held": true})))
}

async fn arrived(State(sim): State<Shared>, Path(key): Path<(String, String)>) -> Answer {
    match sim.gates.lock().await.get(&key) {
        Some(gate) => (
            StatusCode::OK,
            Json(serde_json::json!({"arrived": gate.count()})),
        ),
        None => answer(Err(format!("no gate on {} at {}", key.1, key.0))),
    }
}

async fn release(State(sim): State<Shared>, Path(key): Path<(String, String)>) -> Answer {
    match sim.gates.lock().await.remove(&key) {
        Some(gate) => {
            gate.release();
            (StatusCode::OK, Json(serde_json::json!({"released": true})))
        }
        None => answer(Err(format!("no gate on {} at {}", key.1, key.0))),
    }
}

async fn bmc_ca(State(sim): State<Shared>, Path(ip): Path<String>) -> (StatusCode, String) {
    match sim.nodes.get(&ip).map(SimNode::bmc) {
        Some(Some(bmc)) => (StatusCode::OK, bmc.ca_pem()),
        Some(None) => (
            StatusCode::NOT_FOUND,
            format!("the node at {ip} has no BMC"),
        ),
        None => (StatusCode::NOT_FOUND, format!("no simulated node at {ip}")),
    }
}

/// Resolves on SIGINT or SIGTERM.
async fn stopped() {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {}
                _ = term.recv() => {}
            }
        }
        Err(_) => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

#[tokio::main]
async fn main() -> std::process::ExitCode {
    let options = <Options as clap::Parser>::parse();
    let etcd_size = options.etcd_size.unwrap_or(ichor_sim::DEFAULT_ETCD_SIZE);
    let factory = match SimFactory::start(options.factory).await {
        Ok(factory) => factory,
        Err(error) => {
            eprintln!(
                "ichor-sim: cannot serve the Image Factory on {}: {error}",
                options.factory
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    let mut nodes = BTreeMap::new();
    for i in 0..options.nodes {
        let ip = Ipv4Addr::from(u32::from(options.base) + i);
        let bmc = match bmc_spec(&options, ip) {
            Ok(bmc) => bmc,
            Err(error) => {
                eprintln!("ichor-sim: {error}");
                return std::process::ExitCode::FAILURE;
            }
        };
        let spec = NodeSpec {
            hardware: Hardware::vm(i + 1),
            etcd_size,
            factory: factory.clone(),
            bmc,
            ..NodeSpec::new(SocketAddr::from((ip, options.port)), &options.talos_version)
        };
        match SimNode::spawn(spec).await {
            Ok(node) => {
                let bmc = node
                    .bmc()
                    .map(|b| format!(" bmc {}", b.url()))
                    .unwrap_or_default();
                println!(
                    "node {} uuid={} fingerprint={}{bmc}",
                    node.addr(),
                    node.hardware().uuid,
                    node.fingerprint()
                );
                nodes.insert(ip.to_string(), node);
            }
            Err(error) => {
                eprintln!("ichor-sim: cannot start a node at {ip}: {error}");
                return std::process::ExitCode::FAILURE;
            }
        }
    }
    let sim = Arc::new(Sim {
        nodes,
        gates: Mutex::new(BTreeMap::new()),
    });
    let app = axum::Router::new()
        .route("/nodes", get(list))
        .route("/nodes/{ip}/{action}", post(act))
        .route(
            "/nodes/{ip}/gates/{method}",
            post(hold).get(arrived).delete(release),
        )
        .route("/nodes/{ip}/bmc-ca", get(bmc_ca))
        .with_state(Arc::clone(&sim));
    let listener = match tokio::net::TcpListener::bind(options.control).await {
        Ok(l) => l,
        Err(error) => {
            eprintln!(
                "ichor-sim: cannot serve the control endpoint on {}: {error}",
                options.control
            );
            return std::process::ExitCode::FAILURE;
        }
    };
    match listener.local_addr() {
        Ok(bound) => {
            println!("control http://{bound}");
            println!("factory {}", factory.url());
        }
        Err(error) => {
            eprintln!("ichor-sim: the control endpoint has no address: {error}");
            return std::process::ExitCode::FAILURE;
        }
    }
    let served = axum::serve(listener, app)
        .with_graceful_shutdown(stopped())
        .await;
    if let Err(error) = served {
        eprintln!("ichor-sim: the control endpoint failed: {error}");
        return std::process::ExitCode::FAILURE;
    }
    std::process::ExitCode::SUCCESS
}

#[cfg(test)]
mod tests {
    use clap::Parser as _;

    use super::*;

    fn options(args: &[&str]) -> Result<Options, clap::Error> {
        let mut all = vec![
            "ichor-sim",
            "--nodes",
            "1",
            "--base",
            "127.0.10.1",
            "--talos-version",
            "v1.14.1",
        ];
        all.extend_from_slice(args);
        Options::try_parse_from(all)
    }

    #[test]
    fn a_bmc_is_asked_for_by_port_and_needs_its_password() {
        let ip = Ipv4Addr::new(127, 0, 10, 1);
        let none = options(&[]).expect("parses");
        assert!(bmc_spec(&none, ip).expect("no BMC").is_none());
        let mut no_password = options(&["--bmc-port", "8443"]).expect("parses");
        no_password.bmc_password = None;
        let refused = bmc_spec(&no_password, ip).expect_err("no password");
        assert!(refused.contains(BMC_PASSWORD_ENV), "{refused}");
        let mut given = options(&["--bmc-port", "8443", "--bmc-powered-off"]).expect("parses");
        given.bmc_password = Some("s3cret".into());
        let bmc = bmc_spec(&given, ip).expect("a BMC").expect("asked for");
        assert_eq!(bmc.addr, SocketAddr::from((ip, 8443)));
        assert_eq!(bmc.username, "admin");
        assert!(bmc.powered_off);
        assert!(
            options(&["--bmc-powered-off"]).is_err(),
            "--bmc-powered-off needs --bmc-port"
        );
    }

    #[test]
    fn sizes_are_bytes_or_binary_units() {
        assert_eq!(parse_size("4096"), Some(4096));
        assert_eq!(parse_size("256KiB"), Some(256 << 10));
        assert_eq!(parse_size("4MiB"), Some(4 << 20));
        assert_eq!(parse_size("1GiB"), Some(1 << 30));
        assert_eq!(parse_size("4MB"), None);
        assert_eq!(parse_size("MiB"), None);
    }
}
