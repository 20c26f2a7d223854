//! The discovery sweep beside a bare TCP-connect sweep of the same addresses, at the same
//! concurrency and per-address timeout. Run with `cargo xtask bench discovery` (as root, with
//! `nft`), which writes the table to `docs/benchmarks/discovery.md`.
//!
//! Four /24s on loopback (127.0.110.0/24 to 127.0.113.0/24, 1016 host addresses, port 50000)
//! hold simulated maintenance-mode nodes (`ichor-sim`, in this process on a runtime of their
//! own). Every other address is one of:
//! - closed: nothing listens, the kernel answers the SYN with a RST;
//! - refused: an nftables `reject` answers with ICMP port unreachable, as a host firewall does;
//! - silent: an nftables `drop` discards the SYN, which gets no answer at all.
//!
//! The rules live in a table of their own (`ip ichor_bench_discovery`), matching only TCP to
//! port 50000 on this run's addresses; the table is deleted when the run ends, also on an error,
//! a panic, SIGINT or SIGTERM (and, should a run be killed outright, at the next run's start).
//!
//! Two scenarios: `mixed` (the goal: Ichor ≤ 1.2× the bare sweep) and `closed` (every other
//! address closed, so nothing waits for a timeout and Ichor's reading of each node shows in
//! full; reported only).
//!
//! Settings (environment): `ICHOR_DISCOVERY_NODES` (64), `ICHOR_DISCOVERY_REPS` (5) and
//! `ICHOR_DISCOVERY_REPORT`, a file the Markdown table is written to (it is printed either way).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::io::Write as _;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::{Command, ExitCode, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use ichor_sim::{Hardware, SimNode};
use ichor_talos::discovery::{ProbeOutcome, SweepConfig, addresses, sweep};
use tokio::net::TcpStream;
use tokio::runtime::Runtime;
use tokio::signal::unix::{SignalKind, signal};
use tokio::sync::Semaphore;
use tokio::task::JoinSet;

type Error = Box<dyn std::error::Error + Send + Sync>;

/// The swept ranges: loopback /24s no test uses (`ichor_testenv::nets::DISCOVERY_BENCH`).
const CIDRS: [&str; 4] = [
    "127.0.110.0/24",
    "127.0.111.0/24",
    "127.0.112.0/24",
    "127.0.113.0/24",
];
const _: () = assert!(
    ichor_testenv::nets::DISCOVERY_BENCH.net(0) == 110
        && ichor_testenv::nets::DISCOVERY_BENCH.net(3) == 113
);
/// The nftables table holding this run's rules.
const TABLE: &str = "ichor_bench_discovery";
/// The Talos version the simulated nodes run.
const TALOS_VERSION: &str = "v1.14.1";

/// What is at one address.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Class {
    /// A simulated node in maintenance mode.
    Answering,
    /// Nothing listens: RST.
    Closed,
    /// A firewall rejects: ICMP port unreachable.
    Refused,
    /// A firewall drops: no answer at all.
    Silent,
}

/// Every swept address and what is at it.
struct Layout {
    cidrs: Vec<String>,
    addresses: Vec<(Ipv4Addr, Class)>,
}

impl Layout {
    /// `nodes` answering addresses spread evenly over the ranges; of the others, one in four
    /// silent, one in four refused, the rest closed.
    fn new(nodes: usize) -> Result<Self, Error> {
        let cidrs: Vec<String> = CIDRS.iter().map(|&c| c.to_owned()).collect();
        let all = addresses(&cidrs)?;
        if nodes == 0 || nodes > all.len() / 2 {
            return Err(format!("ICHOR_DISCOVERY_NODES must be 1 to {}", all.len() / 2).into());
        }
        let answering: BTreeSet<usize> = (0..nodes).map(|i| i * all.len() / nodes).collect();
        let mut others = 0usize;
        let addresses = all
            .into_iter()
            .enumerate()
            .map(|(i, address)| {
                if answering.contains(&i) {
                    return (address, Class::Answering);
                }
                others += 1;
                let class = match others % 4 {
                    0 => Class::Silent,
                    1 => Class::Refused,
                    _ => Class::Closed,
                };
                (address, class)
            })
            .collect();
        Ok(Self { cidrs, addresses })
    }

    fn of(&self, class: Class) -> impl Iterator<Item = Ipv4Addr> + '_ {
        self.addresses
            .iter()
            .filter(move |(_, c)| *c == class)
            .map(|(a, _)| *a)
    }

    fn count(&self, class: Class) -> usize {
        self.of(class).count()
    }
}

/// The two scenarios.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Scenario {
    /// Closed, refused and silent addresses: the goal.
    Mixed,
    /// Every address without a node closed: reported only.
    Closed,
}

impl Scenario {
    fn name(self) -> &'static str {
        match self {
            Self::Mixed => "mixed",
            Self::Closed => "closed",
        }
    }
}

/// This run's nftables table; deleted on drop.
struct Firewall;

impl Firewall {
    /// Creates the table with its rules and empty address sets (every address closed).
    fn install() -> Result<Self, Error> {
        // A table left by a run that was killed outright.
        if nft(&format!("list table ip {TABLE}")).is_ok() {
            eprintln!("discovery bench: deleting nftables table ip {TABLE} left by an earlier run");
            nft(&format!("delete table ip {TABLE}"))?;
        }
        nft(&format!(
            "table ip {TABLE} {{\n\
             \x20 set silent {{ type ipv4_addr; }}\n\
             \x20 set refused {{ type ipv4_addr; }}\n\
             \x20 chain input {{\n\
             \x20   type filter hook input priority filter; policy accept;\n\
             \x20   iifname \"lo\" tcp dport 50000 ip daddr @silent drop\n\
             \x20   iifname \"lo\" tcp dport 50000 ip daddr @refused reject with icmp type port-unreachable\n\
             \x20 }}\n\
             }}\n"
        ))
        .map_err(|e| {
            format!(
                "cannot add the nftables rules that make addresses silent or refused ({e}); \
                 the benchmark needs root and nft (Debian: apt-get install nftables)"
            )
        })?;
        eprintln!(
            "discovery bench: added nftables table ip {TABLE} (TCP to port 50000 on this run's \
             addresses only); it is deleted when the run ends"
        );
        Ok(Self)
    }

    /// Fills the sets for `scenario`.
    fn set(&self, scenario: Scenario, layout: &Layout) -> Result<(), Error> {
        let mut script = format!("flush set ip {TABLE} silent\nflush set ip {TABLE} refused\n");
        if scenario == Scenario::Mixed {
            for (set, class) in [("silent", Class::Silent), ("refused", Class::Refused)] {
                let elements: Vec<String> = layout.of(class).map(|a| a.to_string()).collect();
                if !elements.is_empty() {
                    let _ = writeln!(
                        script,
                        "add element ip {TABLE} {set} {{ {} }}",
                        elements.join(", ")
                    );
                }
            }
        }
        nft(&script)
    }
}

impl Drop for Firewall {
    fn drop(&mut self) {
        match nft(&format!("delete table ip {TABLE}")) {
            Ok(()) => eprintln!("discovery bench: deleted nftables table ip {TABLE}"),
            Err(e) => eprintln!(
                "discovery bench: could not delete nftables table ip {TABLE} ({e}); \
                 delete it with `nft delete table ip {TABLE}`"
            ),
        }
    }
}

/// Runs an nft script.
fn nft(script: &str) -> Result<(), Error> {
    let mut child = Command::new("nft")
        .args(["-f", "-"])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("cannot run nft: {e}"))?;
    child
        .stdin
        .take()
        .ok_or("nft's stdin")?
        .write_all(script.as_bytes())?;
    let output = child.wait_with_output()?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "nft failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr).trim()
        )
        .into())
    }
}

/// The bare sweep: connect, then close; the same concurrency limit and per-address timeout,
/// the same task-per-address shape. The addresses that accepted.
async fn bare_sweep(addresses: &[Ipv4Addr], config: SweepConfig) -> Vec<Ipv4Addr> {
    let permits = Arc::new(Semaphore::new(config.concurrency.max(1)));
    let mut tasks = JoinSet::new();
    for &address in addresses {
        let permits = Arc::clone(&permits);
        tasks.spawn(async move {
            let _permit = permits.acquire_owned().await.ok()?;
            let socket = SocketAddr::from((address, config.port));
            let tcp = tokio::time::timeout(config.timeout, TcpStream::connect(socket))
                .await
                .ok()?
                .ok()?;
            drop(tcp);
            Some(address)
        });
    }
    let mut accepted = Vec::new();
    while let Some(result) = tasks.join_next().await {
        if let Ok(Some(address)) = result {
            accepted.push(address);
        }
    }
    accepted.sort_unstable();
    accepted
}

/// Which sweep.
#[derive(Debug, Clone, Copy)]
enum Sweeper {
    Ichor,
    Bare,
}

/// One sweep's wall time; fails unless exactly the simulated nodes were found.
async fn timed(
    sweeper: Sweeper,
    layout: &Layout,
    config: SweepConfig,
    nodes: &BTreeSet<Ipv4Addr>,
) -> Result<Duration, Error> {
    let all: Vec<Ipv4Addr> = layout.addresses.iter().map(|(a, _)| *a).collect();
    let start = Instant::now();
    let (found, others): (BTreeSet<Ipv4Addr>, Vec<String>) = match sweeper {
        Sweeper::Ichor => {
            let mut found = BTreeSet::new();
            let mut others = Vec::new();
            for probe in sweep(&layout.cidrs, config).await? {
                match probe.outcome {
                    ProbeOutcome::Maintenance(_) => {
                        found.insert(probe.address);
                    }
                    outcome => others.push(format!("{}: {outcome:?}", probe.address)),
                }
            }
            (found, others)
        }
        Sweeper::Bare => (
            bare_sweep(&all, config).await.into_iter().collect(),
            Vec::new(),
        ),
    };
    let took = start.elapsed();
    if found != *nodes || !others.is_empty() {
        return Err(format!(
            "the {sweeper:?} sweep found {} of the {} simulated nodes, {} other addresses \
             accepting, and other answers: {others:?}",
            found.intersection(nodes).count(),
            nodes.len(),
            found.difference(nodes).count(),
        )
        .into());
    }
    Ok(took)
}

/// Median, minimum and maximum of a few durations.
#[derive(Debug, Clone, Copy)]
struct Stats {
    median: Duration,
    min: Duration,
    max: Duration,
}

impl Stats {
    fn of(mut runs: Vec<Duration>) -> Self {
        runs.sort_unstable();
        let n = runs.len();
        let median = if n % 2 == 1 {
            runs[n / 2]
        } else {
            (runs[n / 2 - 1] + runs[n / 2]) / 2
        };
        Self {
            median,
            min: runs[0],
            max: runs[n - 1],
        }
    }
}

/// Both sweeps' figures in one scenario.
struct Measured {
    scenario: Scenario,
    ichor: Stats,
    bare: Stats,
}

/// Runs `reps` sweeps of each kind, alternating which goes first.
async fn measure(
    scenario: Scenario,
    layout: &Layout,
    config: SweepConfig,
    reps: usize,
) -> Result<Measured, Error> {
    let nodes: BTreeSet<Ipv4Addr> = layout.of(Class::Answering).collect();
    let (mut ichor, mut bare) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let order = if rep % 2 == 0 {
            [Sweeper::Ichor, Sweeper::Bare]
        } else {
            [Sweeper::Bare, Sweeper::Ichor]
        };
        for sweeper in order {
            let took = timed(sweeper, layout, config, &nodes).await?;
            eprintln!(
                "discovery bench: {} {sweeper:?} #{}: {took:.2?}",
                scenario.name(),
                rep + 1
            );
            match sweeper {
                Sweeper::Ichor => ichor.push(took),
                Sweeper::Bare => bare.push(took),
            }
        }
    }
    Ok(Measured {
        scenario,
        ichor: Stats::of(ichor),
        bare: Stats::of(bare),
    })
}

/// Both scenarios, after one unmeasured sweep of each kind.
async fn measure_all(
    firewall: &Firewall,
    layout: &Layout,
    config: SweepConfig,
    reps: usize,
) -> Result<Vec<Measured>, Error> {
    let nodes: BTreeSet<Ipv4Addr> = layout.of(Class::Answering).collect();
    let mut out = Vec::new();
    firewall.set(Scenario::Closed, layout)?;
    timed(Sweeper::Ichor, layout, config, &nodes).await?;
    timed(Sweeper::Bare, layout, config, &nodes).await?;
    out.push(measure(Scenario::Closed, layout, config, reps).await?);
    firewall.set(Scenario::Mixed, layout)?;
    out.push(measure(Scenario::Mixed, layout, config, reps).await?);
    Ok(out)
}

/// Installs the rules, measures, and removes the rules whatever happens (an error, a panic,
/// SIGINT or SIGTERM).
fn run_measurements(
    runtime: &Runtime,
    layout: &Layout,
    config: SweepConfig,
    reps: usize,
) -> Result<Vec<Measured>, Error> {
    runtime.block_on(async {
        // Listening before the rules exist: an interrupt always finds them to delete.
        let mut int = signal(SignalKind::interrupt())?;
        let mut term = signal(SignalKind::terminate())?;
        let firewall = Firewall::install()?;
        tokio::select! {
            result = measure_all(&firewall, layout, config, reps) => result,
            _ = int.recv() => Err("interrupted (SIGINT)".into()),
            _ = term.recv() => Err("interrupted (SIGTERM)".into()),
        }
    })
}

/// Starts the simulated nodes on their own runtime.
fn start_nodes(runtime: &Runtime, layout: &Layout) -> Result<Vec<SimNode>, Error> {
    runtime.block_on(async {
        let mut nodes = Vec::new();
        for (seed, address) in (1u32..).zip(layout.of(Class::Answering)) {
            let addr = SocketAddr::from((address, ichor_talos::TALOS_API_PORT));
            let node = SimNode::start_with(addr, TALOS_VERSION, Hardware::vm(seed))
                .await
                .map_err(|e| format!("start a simulated node on {addr}: {e}"))?;
            nodes.push(node);
        }
        Ok(nodes)
    })
}

fn seconds(d: Duration) -> String {
    format!("{:.2} s", d.as_secs_f64())
}

/// The Markdown table.
fn table(layout: &Layout, config: SweepConfig, reps: usize, measured: &[Measured]) -> String {
    let total = layout.addresses.len();
    let nodes = layout.count(Class::Answering);
    let mut out = String::new();
    let _ = writeln!(
        out,
        "| scenario | addresses: answering / closed / refused / silent | sweep | median | min | max | addresses/s (median) | nodes found |\n\
         |---|---|---|---:|---:|---:|---:|---:|"
    );
    for m in measured {
        let mix = match m.scenario {
            Scenario::Mixed => format!(
                "{nodes} / {} / {} / {}",
                layout.count(Class::Closed),
                layout.count(Class::Refused),
                layout.count(Class::Silent)
            ),
            Scenario::Closed => format!("{nodes} / {} / 0 / 0", total - nodes),
        };
        for (name, stats) in [
            ("Ichor `discovery::sweep`", m.ichor),
            ("bare TCP connect", m.bare),
        ] {
            let rate = total as f64 / stats.median.as_secs_f64();
            let _ = writeln!(
                out,
                "| {} | {mix} | {name} | {} | {} | {} | {rate:.0} | {nodes} |",
                m.scenario.name(),
                seconds(stats.median),
                seconds(stats.min),
                seconds(stats.max),
            );
        }
    }
    let _ = writeln!(
        out,
        "\n| scenario | Ichor / bare (medians) | goal |\n|---|---:|---|"
    );
    for m in measured {
        let ratio = m.ichor.median.as_secs_f64() / m.bare.median.as_secs_f64();
        let goal = match m.scenario {
            Scenario::Mixed if ratio <= 1.2 => "≤ 1.2×: **met**",
            Scenario::Mixed => "≤ 1.2×: **missed**",
            Scenario::Closed => "reported only",
        };
        let _ = writeln!(out, "| {} | {ratio:.2}× | {goal} |", m.scenario.name());
    }
    if let Some(m) = measured.iter().find(|m| m.scenario == Scenario::Closed) {
        let extra = m.ichor.median.saturating_sub(m.bare.median);
        let _ = writeln!(
            out,
            "\nWith every other address closed, Ichor's sweep takes {:.1} ms more per answering \
             node than the bare one (medians): what reading a node costs beyond the TCP connect.",
            extra.as_secs_f64() * 1000.0 / nodes as f64
        );
    }
    let _ = writeln!(
        out,
        "\n{total} addresses (4 × /24, port {}), concurrency {}, per-address timeout {} \
         (`SweepConfig::default()`, what the manager uses); {reps} sweeps of each kind per \
         scenario, alternating which goes first, after one unmeasured sweep of each.",
        config.port,
        config.concurrency,
        seconds(config.timeout),
    );
    out
}

fn setting(name: &str, default: usize) -> Result<usize, Error> {
    match std::env::var(name) {
        Ok(text) => Ok(text
            .trim()
            .parse()
            .map_err(|_| format!("{name} must be a whole number"))?),
        Err(_) => Ok(default),
    }
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .ok()
        .and_then(|l| l.split_whitespace().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn run() -> Result<(), Error> {
    let nodes = setting("ICHOR_DISCOVERY_NODES", 64)?;
    let reps = setting("ICHOR_DISCOVERY_REPS", 5)?.max(1);
    let layout = Layout::new(nodes)?;
    let config = SweepConfig::default();
    // The nodes get a runtime of their own; the sweeps run on the main one.
    let sim = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let main = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    let started = start_nodes(&sim, &layout)?;
    let load = load_average();
    let measured = run_measurements(&main, &layout, config, reps);
    sim.block_on(async {
        for node in started {
            node.stop().await;
        }
    });
    let mut report = table(&layout, config, reps, &measured?);
    let _ = writeln!(
        report,
        "\n1-minute load average when the sweeps started: {load}."
    );
    println!("\n{report}");
    if let Ok(path) = std::env::var("ICHOR_DISCOVERY_REPORT") {
        std::fs::write(&path, &report).map_err(|e| format!("write {path}: {e}"))?;
    }
    Ok(())
}

fn main() -> ExitCode {
    // `cargo bench` passes `--bench`; `cargo test --benches` does not: nothing to check then.
    if !std::env::args().any(|a| a == "--bench") {
        println!("discovery bench: run with `cargo xtask bench discovery`");
        return ExitCode::SUCCESS;
    }
    match run() {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("discovery bench: {e}");
            ExitCode::FAILURE
        }
    }
}
