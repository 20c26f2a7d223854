//! A fleet on one manager, on the sim target against the real `ichor-manager`: N simulated
//! machines in maintenance mode (one simulator process) over N/20 TalosClusters, each cluster
//! discovering its own /27. The spec approves every machine (three control planes and
//! seventeen workers per cluster, one patch each, as a person or a script would) and waits
//! until every cluster is Ready; then it watches the idle manager until it has looked at
//! every machine again (a round of settled looks, a minute at least). No workload control
//! planes run: a cluster is Ready once its machines run and its control planes are etcd voters.
//! Then the first cluster's `spec.talosVersion` is bumped by a patch version alone (one
//! cluster's serial upgrade), then every other cluster's at once, and each time the spec waits
//! until their nodes run it and their machines and clusters say so; the clusters' drain is off
//! (`spec.drain.enabled: false`: no workload API runs to drain through).
//!
//! It measures, per fleet size (`ICHOR_FLEET_SIZES`, `100,300,1000` unless set): approval to
//! all-Ready, the manager's peak resident set (`VmHWM`), its CPU while idle, its reconciles
//! (`/metrics`), its apiserver requests (the audit log, `ICHOR_AUDIT_DIR`) and the Talos API
//! calls the simulated nodes received; then the other clusters' bump to every node upgraded,
//! against the first cluster's serial upgrade alone, the requests and calls both cost, and the
//! most nodes of one cluster seen upgrading at once.
//!
//! `ICHOR_FLEET_MAX_UNAVAILABLE` sets every cluster's `spec.rollout.maxUnavailable` (a count or a
//! percentage; one worker at a time unless set).
//!
//! Not run by `cargo test` (`test = false`): `cargo xtask bench fleet` runs it with a release
//! manager and writes the table to `docs/benchmarks/fleet.md`.

mod support;

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::Ipv4Addr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{StreamExt as _, TryStreamExt as _};
use ichor_api::cluster::CniPreset;
use ichor_api::common::ConditionStatus;
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{SimNode, Timings};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// Names the fleet sizes, comma-separated machine counts (multiples of 20).
const SIZES_ENV: &str = "ICHOR_FLEET_SIZES";
/// Names every cluster's `spec.rollout.maxUnavailable` (workers upgraded at once; ADR 0077).
const MAX_UNAVAILABLE_ENV: &str = "ICHOR_FLEET_MAX_UNAVAILABLE";
/// Names a file the table is also written to (`cargo xtask bench fleet` reads it).
const REPORT_ENV: &str = "ICHOR_FLEET_REPORT";
/// The fleet sizes unless `ICHOR_FLEET_SIZES` says.
const DEFAULT_SIZES: &[usize] = &[100, 300, 1000];
/// Machines per cluster.
const PER_CLUSTER: usize = 20;
/// Control planes per cluster (the first machines of its range).
const CONTROL_PLANES: usize = 3;
/// The loopback /24s the fleet's nodes use (`127.0.<net>.x`), eight /27s each.
const NETS: std::ops::RangeInclusive<u8> = ichor_testenv::nets::FLEET.range();
/// One cluster's discovery range: a /27.
const BLOCK: usize = 32;
/// The Talos version the nodes run.
const VERSION: &str = "v1.14.1";
/// The Talos version every cluster is bumped to once the fleet idles: the next patch, whose
/// installer the simulated nodes pull from the simulated Image Factory.
const UPGRADE_TO: &str = "v1.14.2";
/// How long the bump to every node upgraded may take before the spec gives up (not a goal: a
/// bound on a run that went wrong).
const UPGRADE_WAIT: Duration = Duration::from_secs(1800);
/// How often the nodes are sampled for two nodes of one cluster upgrading at once (a node's
/// upgrade lasts at least [`simulated_upgrade`], ten times this).
const SAMPLE_EVERY: Duration = Duration::from_millis(20);
/// The clusters' discovery interval: the first sweep runs when a cluster is created.
const DISCOVERY_INTERVAL: &str = "10m";
/// How long the idle manager is watched after convergence.
const IDLE: Duration = Duration::from_secs(60);
/// How long the manager may take to look at every machine again after all-Ready (not a goal:
/// a bound on a run that went wrong).
const SETTLE_WAIT: Duration = Duration::from_secs(900);
/// How long discovery may take to find every machine.
const DISCOVERY_WAIT: Duration = Duration::from_secs(600);
/// How long approval to all-Ready may take before the spec gives up (not a goal: a bound on
/// a run that went wrong).
const READY_WAIT: Duration = Duration::from_secs(1800);
/// The manager's default settled looks a second (`--settled-looks-per-second`), for the table.
const SETTLED_LOOKS_PER_SECOND: u32 = 3;
/// How many approvals are in flight at once.
const APPROVALS_AT_ONCE: usize = 16;
const MIB: f64 = 1024.0 * 1024.0;

/// The simulated timings: the defaults, with background work looking again every 200 ms
/// rather than every 25 ms (a thousand nodes' loops would otherwise keep the shared cores
/// busy).
fn timings() -> Timings {
    Timings {
        tick: Duration::from_millis(200),
        ..Timings::default()
    }
}

/// What a simulated machine spends installing: the install, then the reboot into the
/// installed system.
fn simulated_install() -> Duration {
    let t = timings();
    t.install + t.reboot
}

/// What a simulated machine spends in an upgrade: its upgrade sequence starts this long after
/// the Reboot call, then the reboot's down time (the installer's pull and install answer at
/// once, and a configured node runs again as it boots).
fn simulated_upgrade() -> Duration {
    let t = timings();
    t.sequence + t.reboot
}

/// The simulator's own time for one cluster's serial upgrade: its twenty machines' simulated
/// upgrades one after another, with no look between them.
fn simulated_floor() -> Duration {
    simulated_upgrade() * u32::try_from(PER_CLUSTER).expect("small")
}

/// The fleet sizes to run.
fn sizes() -> Vec<usize> {
    let Ok(text) = std::env::var(SIZES_ENV) else {
        return DEFAULT_SIZES.to_vec();
    };
    let sizes: Vec<usize> = text
        .split(',')
        .map(|s| {
            s.trim().parse::<usize>().unwrap_or_else(|_| {
                panic!("{SIZES_ENV} must list machine counts, e.g. 100,300: {text:?}")
            })
        })
        .collect();
    let most = NETS.len() * (256 / BLOCK) * PER_CLUSTER;
    for size in &sizes {
        assert!(
            *size > 0 && size % PER_CLUSTER == 0 && *size <= most,
            "{SIZES_ENV}: each size must be a multiple of {PER_CLUSTER}, at most {most}: {size}"
        );
    }
    sizes
}

/// Cluster `index`'s range: its /27's network address.
fn range(index: usize) -> Ipv4Addr {
    let per_net = 256 / BLOCK;
    let net = *NETS.start() + u8::try_from(index / per_net).expect("few nets");
    let base = u8::try_from((index % per_net) * BLOCK).expect("within a /24");
    Ipv4Addr::new(127, 0, net, base)
}

/// The `n`th address (1-based) of cluster `index`'s range.
fn host(index: usize, n: usize) -> Ipv4Addr {
    let [a, b, c, d] = range(index).octets();
    Ipv4Addr::new(a, b, c, d + u8::try_from(n).expect("within a /27"))
}

/// The index of the cluster whose range holds `address`.
fn cluster_of(address: Ipv4Addr) -> usize {
    let [_, _, net, last] = address.octets();
    usize::from(net - *NETS.start()) * (256 / BLOCK) + usize::from(last) / BLOCK
}

fn cluster_name(index: usize) -> String {
    format!("fleet-{index:02}")
}

/// Every node's address: twenty per cluster, from the first host of its range.
fn addresses(clusters: usize) -> Vec<Ipv4Addr> {
    (0..clusters)
        .flat_map(|c| (1..=PER_CLUSTER).map(move |n| host(c, n)))
        .collect()
}

/// Every cluster's `spec.rollout.maxUnavailable`, as `ICHOR_FLEET_MAX_UNAVAILABLE` names it (a
/// count, or a percentage such as `25%`); unset, the default: one worker at a time.
fn max_unavailable() -> Option<IntOrString> {
    let value = std::env::var(MAX_UNAVAILABLE_ENV).ok()?;
    Some(match value.parse::<i32>() {
        Ok(count) => IntOrString::Int(count),
        Err(_) => IntOrString::String(value),
    })
}

/// The most nodes of one cluster that may upgrade at once: control planes one at a time, and
/// workers as many as `maxUnavailable` lets be down, resolved here from its definition (a
/// count, or a percentage of the cluster's workers rounded down, at least one), not from the
/// manager's code.
fn most_at_once() -> usize {
    let workers = PER_CLUSTER - CONTROL_PLANES;
    let most = match max_unavailable() {
        None => 1,
        Some(IntOrString::Int(count)) => usize::try_from(count).expect("a positive count"),
        Some(IntOrString::String(percent)) => {
            let percent: usize = percent
                .strip_suffix('%')
                .and_then(|p| p.parse().ok())
                .expect("a percentage such as 25%");
            workers * percent / 100
        }
    };
    most.clamp(1, workers)
}

/// Creates cluster `index`: three control planes, its /27 to discover, its first host the
/// endpoint, no drain before a disruption (no workload API runs to drain through).
async fn create_cluster(target: &SimTarget, index: usize) {
    let mut cluster = TalosCluster::test(&cluster_name(index))
        .namespace(target.namespace())
        .talos(VERSION)
        .endpoint(&format!("https://{}:6443", host(index, 1)))
        .control_planes(i32::try_from(CONTROL_PLANES).expect("small"))
        .cni(CniPreset::Flannel)
        .discovery(&[format!("{}/27", range(index))], DISCOVERY_INTERVAL)
        .install_disk("/dev/vda")
        .build();
    cluster.spec.drain.enabled = false;
    cluster.spec.rollout.max_unavailable = max_unavailable();
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create the cluster");
}

/// Waits until discovery found all `n` machines; returns them.
async fn wait_discovered(target: &SimTarget, n: usize) -> Vec<TalosMachine> {
    let api = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    let deadline = Instant::now() + DISCOVERY_WAIT;
    loop {
        let found = api.list(&ListParams::default()).await.expect("list").items;
        if found.len() >= n {
            return found;
        }
        assert!(
            Instant::now() < deadline,
            "{} of {n} machines discovered within {DISCOVERY_WAIT:?}",
            found.len()
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The approval patch of a discovered machine: the first three of its cluster's range are
/// control planes, the rest workers; hostnames are unique over the fleet.
fn approval(machine: &TalosMachine) -> serde_json::Value {
    let address: Ipv4Addr = machine
        .spec
        .endpoints
        .first()
        .and_then(|e| e.parse().ok())
        .expect("a discovered machine's endpoint");
    let n = usize::from(address.octets()[3]) % BLOCK;
    let cluster = &machine.spec.cluster_ref.name;
    let (role, hostname) = if n <= CONTROL_PLANES {
        ("controlplane", format!("{cluster}-cp-{n}"))
    } else {
        ("worker", format!("{cluster}-w-{n}"))
    };
    json!({"spec": {"approvalState": "approved", "role": role, "hostname": hostname}})
}

/// Approves every machine, a few patches in flight at once.
async fn approve_all(target: &SimTarget, machines: &[TalosMachine]) {
    let api = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    futures::stream::iter(machines.iter().map(|m| {
        let api = api.clone();
        async move {
            api.patch(
                &m.name_any(),
                &PatchParams::default(),
                &Patch::Merge(approval(m)),
            )
            .await
            .map(|_| ())
        }
    }))
    .buffer_unordered(APPROVALS_AT_ONCE)
    .try_collect::<Vec<()>>()
    .await
    .expect("approve");
}

fn is_ready(cluster: &TalosCluster) -> bool {
    cluster.status.as_ref().is_some_and(|s| {
        s.conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.status == ConditionStatus::True)
    })
}

/// Waits until every cluster is Ready (so every approved machine is).
async fn wait_all_ready(target: &SimTarget, clusters: usize) {
    let api = Api::<TalosCluster>::namespaced(target.client(), target.namespace());
    let deadline = Instant::now() + READY_WAIT;
    loop {
        let listed = api.list(&ListParams::default()).await.expect("list").items;
        let waiting: Vec<String> = listed
            .iter()
            .filter(|c| !is_ready(c))
            .map(|c| {
                let message = c
                    .status
                    .as_ref()
                    .and_then(|s| s.conditions.iter().find(|c| c.type_ == conditions::READY))
                    .map(|c| c.message.clone())
                    .unwrap_or_default();
                format!("{}: {message}", c.name_any())
            })
            .collect();
        if listed.len() == clusters && waiting.is_empty() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not Ready within {READY_WAIT:?}: {waiting:?}\n{}",
            target.manager_log_tail()
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The CPU time the process has used (user and system), in clock ticks.
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("the manager's stat");
    // "<pid> (<comm>) <state> …": utime and stime are fields 14 and 15, the 12th and 13th
    // after the name.
    let after = &stat[stat.rfind(')').expect("comm") + 1..];
    let fields: Vec<u64> = after
        .split_whitespace()
        .skip(11)
        .take(2)
        .map(|f| f.parse().expect("a tick count"))
        .collect();
    fields.iter().sum()
}

/// Clock ticks per second (`getconf CLK_TCK`; 100 on Linux unless it says otherwise).
fn ticks_per_second() -> f64 {
    std::process::Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .and_then(|t| t.trim().parse::<f64>().ok())
        .unwrap_or(100.0)
}

/// The audit log a control plane started now writes: the file in `dir` that `before` did
/// not list.
fn new_audit_log(dir: &Path, before: &[PathBuf]) -> Option<PathBuf> {
    audit_logs(dir).into_iter().find(|p| !before.contains(p))
}

fn audit_logs(dir: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(dir)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default()
}

/// The manager's requests in an audit log, from byte `from` to `to`.
fn manager_requests(log: &Path, from: usize, to: usize) -> Vec<ichor_harness::audit::Request> {
    let text = std::fs::read(log).unwrap_or_default();
    let slice = String::from_utf8_lossy(&text[from.min(text.len())..to.min(text.len())]);
    let user = format!(
        "system:serviceaccount:{}:{}",
        ichor_harness::sim::SYSTEM_NAMESPACE,
        ichor_api::admission::MANAGER_NAME
    );
    ichor_harness::audit::requests(&slice)
        .into_iter()
        .filter(|r| r.user == user)
        .collect()
}

/// The manager's requests from byte `from` to `to` of `log` by verb and resource (and field
/// manager), most first, per machine: what the requests column is made of.
fn request_breakdown(log: &Path, from: usize, to: usize, machines: usize) -> String {
    let mut counts = std::collections::BTreeMap::<String, usize>::new();
    for request in manager_requests(log, from, to) {
        let mut key = format!(
            "{} {}",
            request.permission.verb, request.permission.resource
        );
        if let Some(manager) = &request.field_manager {
            key = format!("{key} ({manager})");
        }
        *counts.entry(key).or_default() += 1;
    }
    let mut counts: Vec<_> = counts.into_iter().collect();
    counts.sort_by_key(|c| std::cmp::Reverse(c.1));
    counts
        .iter()
        .map(|(key, n)| format!("{key}: {:.2}", *n as f64 / machines as f64))
        .collect::<Vec<_>>()
        .join(", ")
}

/// Who looks at the fleet as a person would (audited under this name; the test administrator
/// is not audited).
const VIEWER: &str = "fleet-viewer";
/// Who sends the request that marks the end of a view in the audit log.
const MARKER: &str = "fleet-view-marker";

/// The requests in an audit log from byte `from` to `to` sent by `user`.
fn requests_of(
    log: &Path,
    from: usize,
    to: usize,
    user: &str,
) -> Vec<ichor_harness::audit::Request> {
    let text = std::fs::read(log).unwrap_or_default();
    let slice = String::from_utf8_lossy(&text[from.min(text.len())..to.min(text.len())]);
    ichor_harness::audit::requests(&slice)
        .into_iter()
        .filter(|r| r.user == user)
        .collect()
}

/// What a person's view of the fleet costs the apiserver: the requests (and the lists among
/// them) of `kubectl ichor describe` of one cluster, of `kubectl ichor pending`, and of the
/// demo's machine table, each counted in the audit log.
async fn view_requests(target: &SimTarget, audit: &Path) -> Vec<(&'static str, usize, usize)> {
    let client = target
        .client_as(VIEWER, Some("system:masters"))
        .await
        .expect("a client for the viewer");
    let conn = kubectl_ichor::connect::Connection {
        client,
        namespace: target.namespace().to_owned(),
    };
    let marker = target
        .client_as(MARKER, Some("system:masters"))
        .await
        .expect("a client for the marker");
    let mut counted = Vec::new();
    for view in [
        "kubectl ichor describe",
        "kubectl ichor pending",
        "demo table",
    ] {
        let from = audit_len(Some(audit));
        match view {
            "kubectl ichor describe" => {
                kubectl_ichor::describe::describe(&conn, &cluster_name(0))
                    .await
                    .expect("describe");
            }
            "kubectl ichor pending" => {
                kubectl_ichor::machines::pending(&conn)
                    .await
                    .expect("pending");
            }
            _ => {
                ichor_harness::table::machines(&conn.client, &conn.namespace).await;
            }
        }
        // The audit log is written as requests finish: a request of another user sent after
        // the view, once in the log, marks that the view's requests are in it.
        Api::<k8s_openapi::api::core::v1::Namespace>::all(marker.clone())
            .get_opt(target.namespace())
            .await
            .expect("the marker request");
        let to = ichor_testenv::wait::eventually(
            "the marker request in the audit log",
            Duration::from_secs(30),
            || async {
                let to = audit_len(Some(audit));
                (!requests_of(audit, from, to, MARKER).is_empty()).then_some(to)
            },
        )
        .await;
        let requests = requests_of(audit, from, to, VIEWER);
        let lists = requests
            .iter()
            .filter(|r| r.permission.verb == "list")
            .count();
        counted.push((view, requests.len(), lists));
    }
    counted
}

fn audit_len(log: Option<&Path>) -> usize {
    log.and_then(|l| std::fs::metadata(l).ok())
        .map_or(0, |m| usize::try_from(m.len()).unwrap_or(usize::MAX))
}

/// Bumps the `spec.talosVersion` of the clusters in `clusters` to [`UPGRADE_TO`], as a person
/// (or Git) does.
async fn bump(target: &SimTarget, clusters: std::ops::Range<usize>) {
    let api = Api::<TalosCluster>::namespaced(target.client(), target.namespace());
    for index in clusters {
        api.patch(
            &cluster_name(index),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"talosVersion": UPGRADE_TO}})),
        )
        .await
        .expect("bump the cluster's talosVersion");
    }
}

/// What the nodes were seen doing while the fleet upgraded.
#[derive(Debug, Clone, Copy, Default)]
struct Upgrading {
    /// The most nodes of one cluster seen upgrading in one sample.
    most_at_once: usize,
    /// How many samples were taken.
    samples: usize,
}

/// Samples the nodes every [`SAMPLE_EVERY`] until stopped: a node is upgrading from the reply
/// to its Upgrade call (`LifecycleService.Upgrade`, counted by the node when its reply leaves)
/// until it answers again on [`UPGRADE_TO`].
struct UpgradeWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Upgrading>,
}

impl UpgradeWatch {
    fn start(nodes: Vec<SimNode>, clusters: usize) -> Self {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let before: Vec<usize> = nodes.iter().map(|n| n.calls("Upgrade")).collect();
        let task = tokio::spawn(async move {
            let mut seen = Upgrading::default();
            while !flag.load(Ordering::SeqCst) {
                let mut upgrading = vec![0_usize; clusters];
                for (node, before) in nodes.iter().zip(&before) {
                    let sent = node.calls("Upgrade") > *before;
                    let back = node.talos_version() == UPGRADE_TO && node.is_serving().await;
                    if sent && !back {
                        let std::net::IpAddr::V4(ip) = node.addr().ip() else {
                            continue;
                        };
                        upgrading[cluster_of(ip)] += 1;
                    }
                }
                seen.most_at_once = seen
                    .most_at_once
                    .max(upgrading.into_iter().max().unwrap_or(0));
                seen.samples += 1;
                tokio::time::sleep(SAMPLE_EVERY).await;
            }
            seen
        });
        Self { stop, task }
    }

    async fn finish(self) -> Upgrading {
        self.stop.store(true, Ordering::SeqCst);
        self.task.await.expect("the upgrade watch")
    }
}

/// Whether a cluster's rollout reads `n/n` on [`UPGRADE_TO`] and `VersionRolledOut` holds.
fn rolled_out(cluster: &TalosCluster) -> bool {
    cluster.status.as_ref().is_some_and(|s| {
        s.core.rollout.as_ref().is_some_and(|r| {
            r.talos_version == UPGRADE_TO && r.total > 0 && r.up_to_date == r.total
        }) && s
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::VERSION_ROLLED_OUT && c.status == ConditionStatus::True)
    })
}

/// Whether a machine's `UpToDate` says it runs the declaration.
fn runs_declared(machine: &TalosMachine) -> bool {
    machine.status.as_ref().is_some_and(|s| {
        s.conditions.iter().any(|c| {
            c.type_ == conditions::UP_TO_DATE
                && c.status == ConditionStatus::True
                && c.reason == reasons::RUNS_DECLARED
        })
    })
}

/// Waits until every node of the clusters in `clusters` runs [`UPGRADE_TO`] (its answer),
/// each of their rollouts reads n/n with `VersionRolledOut` true, and each of their machines'
/// `UpToDate` says it runs the declaration. Returns how long after `bumped` the nodes ran it,
/// and the whole.
async fn wait_upgraded(
    target: &SimTarget,
    clusters: std::ops::Range<usize>,
    bumped: Instant,
) -> (Duration, Duration) {
    let cluster_api = Api::<TalosCluster>::namespaced(target.client(), target.namespace());
    let machine_api = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    let names: Vec<String> = clusters.clone().map(cluster_name).collect();
    let nodes: Vec<&SimNode> = target
        .nodes()
        .iter()
        .filter(|n| match n.addr().ip() {
            std::net::IpAddr::V4(ip) => clusters.contains(&cluster_of(ip)),
            std::net::IpAddr::V6(_) => false,
        })
        .collect();
    let mut nodes_on = None;
    loop {
        if nodes_on.is_none() {
            let mut all = true;
            for node in &nodes {
                if node.talos_version() != UPGRADE_TO || !node.is_serving().await {
                    all = false;
                    break;
                }
            }
            if all {
                nodes_on = Some(bumped.elapsed());
            }
        }
        if let Some(nodes_on) = nodes_on {
            let listed: Vec<TalosCluster> = cluster_api
                .list(&ListParams::default())
                .await
                .expect("list")
                .items
                .into_iter()
                .filter(|c| names.contains(&c.name_any()))
                .collect();
            if listed.len() == names.len() && listed.iter().all(rolled_out) {
                let machines = machine_api
                    .list(&ListParams::default())
                    .await
                    .expect("list")
                    .items;
                if machines
                    .iter()
                    .filter(|m| names.contains(&m.spec.cluster_ref.name))
                    .all(runs_declared)
                {
                    return (nodes_on, bumped.elapsed());
                }
            }
        }
        if bumped.elapsed() >= UPGRADE_WAIT {
            let running: BTreeMap<String, usize> =
                target.nodes().iter().fold(BTreeMap::new(), |mut m, n| {
                    *m.entry(n.talos_version()).or_default() += 1;
                    m
                });
            let listed = cluster_api
                .list(&ListParams::default())
                .await
                .expect("list")
                .items;
            let rollouts: Vec<String> = listed
                .iter()
                .map(|c| {
                    let status = c.status.as_ref();
                    let summary = status
                        .and_then(|s| s.core.rollout.as_ref())
                        .map(|r| r.summary.clone())
                        .unwrap_or_default();
                    let condition = status
                        .and_then(|s| {
                            s.conditions
                                .iter()
                                .find(|c| c.type_ == conditions::VERSION_ROLLED_OUT)
                        })
                        .map(|c| format!("{:?} {}: {}", c.status, c.reason, c.message))
                        .unwrap_or_default();
                    format!("{} {summary} {condition}", c.name_any())
                })
                .collect();
            panic!(
                "not upgraded within {UPGRADE_WAIT:?}: nodes {running:?}, rollouts {rollouts:?}\n{}",
                target.manager_log_tail()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What the counters say at one moment.
#[derive(Debug, Clone, Default)]
struct Counters {
    reconciles: BTreeMap<&'static str, u64>,
    /// TalosMachine reconciles skipped as echoes of a machine's own last look.
    skipped: u64,
    rpcs: usize,
    audit: usize,
}

const KINDS: &[&str] = &["TalosMachine", "TalosCluster"];

async fn counters(target: &SimTarget, audit: Option<&Path>) -> Counters {
    let mut reconciles = BTreeMap::new();
    for kind in KINDS {
        reconciles.insert(
            *kind,
            target.manager_reconciles(kind).await.expect("metrics"),
        );
    }
    Counters {
        reconciles,
        skipped: target
            .manager_skipped("TalosMachine")
            .await
            .expect("metrics"),
        rpcs: target.nodes().iter().map(ichor_sim::SimNode::rpcs).sum(),
        audit: audit_len(audit),
    }
}

/// One fleet's figures.
#[derive(Debug, Clone)]
struct Measured {
    machines: usize,
    clusters: usize,
    discovered: Duration,
    converged: Duration,
    peak: u64,
    rss_after: u64,
    /// From the first moment after all-Ready with no reconcile waiting for its turn until
    /// every machine was looked at again (its first settled look): the idle round the idle
    /// columns measure (a minute at least).
    settled: Duration,
    idle_cpu: f64,
    at_approval: Counters,
    at_ready: Counters,
    /// When no reconcile waited for its turn any more, after all-Ready: the idle round's start.
    at_quiet: Counters,
    after_idle: Counters,
    audit: Option<PathBuf>,
    /// Requests and lists of each person's view of the fleet ([`view_requests`]).
    views: Vec<(&'static str, usize, usize)>,
    /// The first cluster's serial upgrade alone: from the bump of its `talosVersion` until its
    /// nodes answered on it, and until its machines' `UpToDate` and its rollout said so.
    alone: (Duration, Duration),
    /// From the bump of every other cluster's `talosVersion` until each of their nodes
    /// answered on it.
    nodes_upgraded: Duration,
    /// From that bump until each of their nodes ran it, and each of their machines'
    /// `UpToDate` and clusters' rollouts said so.
    upgraded: Duration,
    at_bump: Counters,
    at_upgraded: Counters,
    /// What the nodes were seen doing through both upgrades.
    upgrading: Upgrading,
    /// The fewest and most Upgrade calls a node answered through both upgrades.
    upgrade_calls: (usize, usize),
}

impl Measured {
    fn reconciles(&self, kind: &str, from: &Counters, to: &Counters) -> f64 {
        (to.reconciles[kind] - from.reconciles[kind]) as f64 / self.machines as f64
    }

    fn skipped(&self, from: &Counters, to: &Counters) -> f64 {
        (to.skipped - from.skipped) as f64 / self.machines as f64
    }

    fn requests(&self, from: &Counters, to: &Counters) -> f64 {
        self.audit.as_deref().map_or(f64::NAN, |log| {
            manager_requests(log, from.audit, to.audit).len() as f64 / self.machines as f64
        })
    }

    fn rpcs(&self, from: &Counters, to: &Counters) -> f64 {
        (to.rpcs - from.rpcs) as f64 / self.machines as f64
    }
}

/// The runtime the simulated nodes run on: two threads of their own, so that a thousand
/// nodes and the spec's client (its approvals, its waits) do not share one runtime's two
/// threads. Kept for the whole process: a runtime is not dropped inside another.
fn nodes_runtime() -> tokio::runtime::Handle {
    static RUNTIME: std::sync::OnceLock<tokio::runtime::Runtime> = std::sync::OnceLock::new();
    RUNTIME
        .get_or_init(|| {
            tokio::runtime::Builder::new_multi_thread()
                .worker_threads(2)
                .thread_name("sim-nodes")
                .enable_all()
                .build()
                .expect("the simulated nodes' runtime")
        })
        .handle()
        .clone()
}

/// Brings up a fleet of `machines`, approves it, waits for all-Ready and measures.
async fn run(machines: usize) -> Measured {
    let clusters = machines / PER_CLUSTER;
    let audit_dir = std::env::var_os(ichor_testenv::AUDIT_DIR_ENV).map(PathBuf::from);
    let before = audit_dir.as_deref().map(audit_logs).unwrap_or_default();
    let target = SimTarget::up(SimOptions {
        timings: timings(),
        more_addresses: addresses(clusters),
        // The manager as shipped: its default requeue, sweep timeout and Lease.
        requeue_ms: 2000,
        sweep_timeout_ms: 2000,
        lease_seconds: 15,
        nodes_runtime: Some(nodes_runtime()),
        ..SimOptions::new(0, *NETS.start(), VERSION)
    })
    .await
    .expect("sim target");
    let audit = audit_dir.and_then(|d| new_audit_log(&d, &before));
    let pid = target.manager_pid().expect("the manager runs");

    let started = Instant::now();
    for index in 0..clusters {
        create_cluster(&target, index).await;
    }
    let found = wait_discovered(&target, machines).await;
    let discovered = started.elapsed();
    eprintln!("{machines}: discovered in {discovered:?}");

    let at_approval = counters(&target, audit.as_deref()).await;
    let approved = Instant::now();
    approve_all(&target, &found).await;
    wait_all_ready(&target, clusters).await;
    let converged = approved.elapsed();
    let at_ready = counters(&target, audit.as_deref()).await;
    eprintln!("{machines}: all Ready {converged:?} after approval");
    if let Some(log) = audit.as_deref() {
        let breakdown = request_breakdown(log, at_approval.audit, at_ready.audit, machines);
        eprintln!("{machines}: apiserver requests per machine to all-Ready: {breakdown}");
    }
    // The looks still waiting for their turn at all-Ready (the wakes of the clusters that just
    // became Ready) run first: the idle round starts once none waits.
    let drained = drain(&target).await;
    let at_quiet = counters(&target, audit.as_deref()).await;
    eprintln!(
        "{machines}: no reconcile waiting {drained:?} after all-Ready ({} more TalosMachine reconciles)",
        at_quiet.reconciles["TalosMachine"] - at_ready.reconciles["TalosMachine"]
    );
    // Idle: one round of settled looks, every machine looked at once more (and a minute at
    // least), what an idle fleet costs the manager over any such round.
    let cpu_before = cpu_ticks(pid);
    let settled = settle(&target, machines, &at_quiet).await;
    eprintln!("{machines}: every machine looked at again {settled:?} after that");
    tokio::time::sleep(IDLE.saturating_sub(settled)).await;
    let idle = settled.max(IDLE);
    let idle_cpu = (cpu_ticks(pid) - cpu_before) as f64 / ticks_per_second() / idle.as_secs_f64();
    let after_idle = counters(&target, audit.as_deref()).await;
    if let Some(log) = audit.as_deref() {
        let breakdown = request_breakdown(log, at_quiet.audit, after_idle.audit, machines);
        eprintln!("{machines}: apiserver requests per machine idle: {breakdown}");
    }
    let views = match audit.as_deref() {
        Some(log) => view_requests(&target, log).await,
        None => Vec::new(),
    };
    let peak = support::status_bytes(pid, "VmHWM");
    let rss_after = support::status_bytes(pid, "VmRSS");
    // The first cluster's Talos bumped by a patch version alone: one cluster's serial upgrade,
    // the nodes one at a time. Then every other cluster's at once: they upgrade side by side.
    let calls_before: Vec<usize> = target.nodes().iter().map(|n| n.calls("Upgrade")).collect();
    let watch = UpgradeWatch::start(target.nodes().to_vec(), clusters);
    let at_bump = counters(&target, audit.as_deref()).await;
    let bumped = Instant::now();
    bump(&target, 0..1).await;
    let alone = wait_upgraded(&target, 0..1, bumped).await;
    eprintln!("{machines}: the first cluster alone on {UPGRADE_TO} {alone:?} after its bump");
    let bumped = Instant::now();
    bump(&target, 1..clusters).await;
    let (nodes_upgraded, upgraded) = wait_upgraded(&target, 1..clusters, bumped).await;
    let at_upgraded = counters(&target, audit.as_deref()).await;
    let upgrading = watch.finish().await;
    let calls: Vec<usize> = target
        .nodes()
        .iter()
        .zip(&calls_before)
        .map(|(n, before)| n.calls("Upgrade") - before)
        .collect();
    let upgrade_calls = (
        calls.iter().copied().min().unwrap_or(0),
        calls.iter().copied().max().unwrap_or(0),
    );
    eprintln!(
        "{machines}: every other cluster's node on {UPGRADE_TO} {nodes_upgraded:?} after their bump, said so {upgraded:?}; \
         most of one cluster upgrading at once {} over {} samples; Upgrade calls per node {upgrade_calls:?}; \
         peak RSS through it {:.1} MiB",
        upgrading.most_at_once,
        upgrading.samples,
        support::status_bytes(pid, "VmHWM") as f64 / MIB,
    );
    if let Some(log) = audit.as_deref() {
        let breakdown = request_breakdown(log, at_bump.audit, at_upgraded.audit, machines);
        eprintln!("{machines}: apiserver requests per machine through the upgrade: {breakdown}");
    }
    let measured = Measured {
        machines,
        clusters,
        discovered,
        converged,
        peak,
        rss_after,
        settled,
        idle_cpu,
        at_approval,
        at_ready,
        at_quiet,
        after_idle,
        audit,
        views,
        alone,
        nodes_upgraded,
        upgraded,
        at_bump,
        at_upgraded,
        upgrading,
        upgrade_calls,
    };
    eprintln!("{machines}: {measured:?}");
    target.down().await;
    measured
}

/// Waits until no reconcile of the manager's machine and cluster controllers waits for its
/// turn (`ichor_reconciles_waiting`), seen twice a second apart. Returns how long that took.
async fn drain(target: &SimTarget) -> Duration {
    let started = Instant::now();
    let mut quiet = 0;
    while quiet < 2 {
        let text = target.manager_metrics().await.expect("metrics");
        let waiting: f64 = text
            .lines()
            .filter(|l| l.starts_with("ichor_reconciles_waiting{"))
            .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
            .sum();
        quiet = if waiting == 0.0 { quiet + 1 } else { 0 };
        assert!(
            started.elapsed() < SETTLE_WAIT,
            "reconciles still waiting {SETTLE_WAIT:?} after all-Ready"
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    started.elapsed()
}

/// Waits until the manager has looked at every machine once since `at_ready`: a
/// round of settled looks, which the idle columns measure. Returns how long that took.
async fn settle(target: &SimTarget, machines: usize, at_ready: &Counters) -> Duration {
    let started = Instant::now();
    let before = at_ready.reconciles["TalosMachine"];
    loop {
        let now = target
            .manager_reconciles("TalosMachine")
            .await
            .expect("metrics");
        if now - before >= machines as u64 {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < SETTLE_WAIT,
            "{} of {machines} machines looked at again in {SETTLE_WAIT:?}",
            now - before
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "missed" }
}

/// The table `cargo xtask bench fleet` puts in `docs/benchmarks/fleet.md`.
fn table(runs: &[Measured]) -> String {
    let install = simulated_install().as_secs_f64();
    let bound = 1.1 * install + 60.0;
    let mut out = String::from(
        "| machines (clusters) | discovery | approval to all-Ready | manager peak RSS (VmHWM) | RSS after | idle round | idle CPU | TalosMachine reconciles / machine | echoes skipped / machine | TalosCluster reconciles / machine | apiserver requests / machine | Talos RPCs / machine | idle: requests, RPCs / machine |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let (a, b) = (&r.at_approval, &r.at_ready);
        let (c, d) = (&r.at_quiet, &r.after_idle);
        let _ = writeln!(
            out,
            "| {} ({}) | {:.1} s | {:.1} s ({}) | {:.1} MiB ({}) | {:.1} MiB | {:.0} s | {:.2}% ({}) | {:.1} ({}) | {:.1} | {:.2} | {:.1} | {:.1} | {:.2}, {:.2} |",
            r.machines,
            r.clusters,
            r.discovered.as_secs_f64(),
            r.converged.as_secs_f64(),
            met(r.converged.as_secs_f64() <= bound),
            r.peak as f64 / MIB,
            met(r.peak as f64 <= 64.0 * MIB),
            r.rss_after as f64 / MIB,
            r.settled.as_secs_f64(),
            r.idle_cpu * 100.0,
            met(r.idle_cpu <= 0.01),
            r.reconciles("TalosMachine", a, b),
            met(r.reconciles("TalosMachine", a, b) <= 10.0),
            r.skipped(a, b),
            r.reconciles("TalosCluster", a, b),
            r.requests(a, b),
            r.rpcs(a, b),
            r.requests(c, d),
            r.rpcs(c, d),
        );
    }
    let t = timings();
    let _ = write!(
        out,
        "\nGoals: approval to all-Ready within 1.1 × the simulated install time + 60 s = {bound:.1} s \
         (a simulated install is {install:.1} s: {:?} installing and a {:?} reboot; a control plane \
         also waits {:?} for bootstrap to be available, {:?} for etcd discovery and {:?} to be \
         promoted, background work looks again every {:?}); peak RSS ≤ 64 MiB; idle CPU ≤ 1% of \
         a core; ≤ 10 TalosMachine reconciles per machine. Reconciles, requests and RPCs are \
         counted from the first approval to all-Ready. The idle columns count one round of settled \
         looks from the first moment after all-Ready when no reconcile waits for its turn (the \
         clusters that became Ready last woke their machines), until the manager has looked at \
         every machine again (the idle round; a minute at least): a settled machine is looked at every 60 s, or less often in \
         a fleet too big for its settled looks to stay at most {} a second (ADR 0041), so any \
         such round costs what the fleet costs idle.\n",
        t.install,
        t.reboot,
        t.bootstrap_window,
        t.discovery,
        t.promotion,
        t.tick,
        SETTLED_LOOKS_PER_SECOND
    );
    out
}

/// The upgrade's table: the first cluster's `talosVersion` bumped alone once the fleet idles,
/// then every other cluster's at once.
fn upgrade_table(runs: &[Measured]) -> String {
    let simulated = simulated_floor().as_secs_f64();
    let mut out = format!(
        "\nAn upgrade of the fleet: the first cluster's `spec.talosVersion` bumped from {VERSION} to {UPGRADE_TO} alone once the idle round is measured (one cluster's serial upgrade, the floor), then every other cluster's at once:\n\n\
         | machines (clusters) | the first cluster alone: bump to every node upgraded (nodes answering on it) | the others at once: bump to every node upgraded (nodes answering on it) | ratio to the floor | TalosMachine, TalosCluster reconciles / machine | apiserver requests / machine | Talos RPCs / machine | most nodes of one cluster upgrading at once (samples) | Upgrade calls per node |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|\n",
    );
    for r in runs {
        let (a, b) = (&r.at_bump, &r.at_upgraded);
        let floor = r.alone.1.as_secs_f64();
        let ratio = r.upgraded.as_secs_f64() / floor;
        let calls = if r.upgrade_calls.0 == r.upgrade_calls.1 {
            r.upgrade_calls.0.to_string()
        } else {
            format!("{} to {}", r.upgrade_calls.0, r.upgrade_calls.1)
        };
        let _ = writeln!(
            out,
            "| {} ({}) | {floor:.1} s ({:.1} s) | {:.1} s ({:.1} s) | {ratio:.2} × ({}) | {:.1}, {:.2} | {:.1} | {:.1} | {} ({}) | {calls} |",
            r.machines,
            r.clusters,
            r.alone.0.as_secs_f64(),
            r.upgraded.as_secs_f64(),
            r.nodes_upgraded.as_secs_f64(),
            met(ratio <= 1.2),
            r.reconciles("TalosMachine", a, b),
            r.reconciles("TalosCluster", a, b),
            r.requests(a, b),
            r.rpcs(a, b),
            r.upgrading.most_at_once,
            r.upgrading.samples,
        );
    }
    let t = timings();
    let most = most_at_once();
    let batches = match max_unavailable() {
        None => String::new(),
        Some(value) => {
            let value = match value {
                IntOrString::Int(count) => count.to_string(),
                IntOrString::String(percent) => percent,
            };
            format!(
                "Every cluster's `spec.rollout.maxUnavailable` is {value}: its control planes upgrade one at a time, then its workers up to {most} at once, so the floor is that cluster's rollout in batches. "
            )
        }
    };
    let _ = write!(
        out,
        "\n{batches}Goal: the other clusters, bumped at once, all upgraded within 1.2 × the first cluster's serial upgrade alone (the floor): the clusters upgrade side by side, so a fleet's upgrade takes about one cluster's. \
         A cluster's serial upgrade is one node at a time, each looked at again at the manager's shipped progress pace (2 s) after its reboot to verify it, and the next node's turn starting at once (ADR 0071). \
         The simulator alone would take {PER_CLUSTER} × ({:?} for the upgrade sequence to start after the Reboot call + a {:?} reboot) = {simulated:.1} s for one cluster (the simulated installer's pull and install answer at once, and a node runs again as it boots). \
         Each clock runs from the bump until each node of those clusters answers on {UPGRADE_TO} (in brackets), each of their machines' `UpToDate` is true (`RunsDeclared`) and each of their `status.rollout` reads n/n with `VersionRolledOut` true. \
         Reconciles, requests (the manager's entries in the audit log) and RPCs (the calls the nodes received) are counted from the first bump to the end, per machine. \
         The clusters' drain is off (`spec.drain.enabled: false`): no workload control planes run, so there is no Node to cordon or pod to evict. \
         A node counts as upgrading from the reply to its Upgrade call until it answers again on {UPGRADE_TO}; every node is sampled every {SAMPLE_EVERY:?}, and the column gives the most nodes of one cluster seen upgrading in one sample (at most {most}).\n",
        t.sequence, t.reboot,
    );
    out
}

/// What a person's views of the fleet cost, per fleet size: requests (lists among them) in
/// the audit log.
fn views_table(runs: &[Measured]) -> String {
    let mut out = String::from(
        "\nWhat a person's view of the fleet costs the apiserver (the audit log's requests, lists among them; pages of 500):\n\n\
         | machines | kubectl ichor describe (one cluster) | kubectl ichor pending | demo table |\n\
         |---|---:|---:|---:|\n",
    );
    for r in runs {
        let cells: Vec<String> = r
            .views
            .iter()
            .map(|(_, requests, lists)| format!("{requests} ({lists} lists)"))
            .collect();
        let _ = writeln!(out, "| {} | {} |", r.machines, cells.join(" | "));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fleet_of_machines_on_one_manager_converges_idles_and_upgrades() {
    let mut runs = Vec::new();
    for size in sizes() {
        runs.push(run(size).await);
        let report = format!(
            "{}{}{}",
            table(&runs),
            upgrade_table(&runs),
            views_table(&runs)
        );
        println!("\n{report}");
        if let Some(path) = std::env::var_os(REPORT_ENV) {
            std::fs::write(&path, &report).expect("write the report");
        }
    }
    // What must hold whatever the timings: every machine was reconciled, every node asked.
    // A person's views list in pages, never once per machine.
    for run in &runs {
        assert!(run.at_ready.reconciles["TalosMachine"] >= run.machines as u64);
        assert!(run.at_ready.rpcs > run.at_approval.rpcs);
        // Every node upgraded once, never two of one cluster at once.
        assert_eq!(run.upgrade_calls, (1, 1), "each node upgraded once");
        assert!(
            run.upgrading.most_at_once <= most_at_once(),
            "at most {} nodes of a cluster upgrading at a time, saw {}",
            most_at_once(),
            run.upgrading.most_at_once
        );
        for (view, requests, _) in &run.views {
            assert!(
                *requests <= 2 + run.machines.div_ceil(500),
                "{view} sent {requests} requests for {} machines",
                run.machines
            );
        }
    }
}
