//! The webhook under load, beside a bare TLS server: run by `cargo xtask bench webhook`
//! (docs/benchmarks/webhook.md), not with every other test. A measurement, not a test: it
//! asserts what the runs did (every answer 200, each review decided as expected), never how
//! fast.
//!
//! `oha` (from crates.io) drives, at one concurrency and over TLS, first `ichor-tls-echo` (the
//! same server stack answering a fixed body of an AdmissionReview answer's size: the limit),
//! then `ichor-webhook` as the images ship it, backed by a real kube-apiserver and etcd, with
//! two mixes of AdmissionReview bodies:
//! - **A**: refusals and worker deletes, no writes: the delete of an applied control plane
//!   without the allow-delete annotation (refused) and the delete of an applied worker
//!   (allowed, nothing reserved), each request one of the two at random;
//! - **B**: the delete of an annotated control plane of a healthy three-member cluster,
//!   allowed with its removal reservation written on the TalosCluster; the reservation is
//!   removed before each run.
//!
//! Inputs (environment): `ICHOR_WEBHOOK_BIN`, `ICHOR_TLS_ECHO_BIN`, `ICHOR_OHA_BIN`, and
//! `ICHOR_WEBHOOK_BENCH_REPORT` (where the Markdown table goes); optional
//! `ICHOR_WEBHOOK_BENCH_SECONDS` (each measured run, 10 unless set) and
//! `ICHOR_WEBHOOK_BENCH_CONCURRENCY` (16 unless set).

mod support;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use ichor_api::names::annotations;
use ichor_api::testing::MachineBuilder;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_testenv::ControlPlane;
use ichor_testenv::TestEnv;
use ichor_webhook::{Guard, WEBHOOK_PATH};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use kube::Api;
use kube::api::{DynamicObject, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use serde_json::{Value, json};
use support::api;

/// Seconds of each measured run unless `ICHOR_WEBHOOK_BENCH_SECONDS` says.
const SECONDS: u64 = 10;
/// Requests in flight unless `ICHOR_WEBHOOK_BENCH_CONCURRENCY` says.
const CONCURRENCY: u64 = 16;
/// Seconds of the warm-up run before each measured one (connections, caches, the allocator).
const WARM_UP_SECONDS: u64 = 2;
/// The Linux clock tick of `/proc/<pid>/stat` (`USER_HZ`, 100 on every Linux ABI in use).
const TICKS_PER_SECOND: f64 = 100.0;

fn env_path(name: &str) -> PathBuf {
    std::env::var_os(name)
        .map(PathBuf::from)
        .unwrap_or_else(|| panic!("{name} must be set (cargo xtask bench webhook sets it)"))
}

fn env_number(name: &str, default: u64) -> u64 {
    std::env::var(name).map_or(default, |text| {
        text.trim()
            .parse()
            .unwrap_or_else(|_| panic!("{name} must be a whole number"))
    })
}

/// A server process of the run: killed when dropped.
struct Server {
    child: tokio::process::Child,
    addr: SocketAddr,
}

impl Server {
    /// Starts `command` with its output going to the file `log` (as a container's goes to
    /// its log), and waits for its line `listening on ADDR`.
    async fn start(mut command: tokio::process::Command, log: &Path) -> Self {
        let file = std::fs::File::create(log).expect("create the log");
        command.stdin(Stdio::null()).stdout(file).kill_on_drop(true);
        let child = command.spawn().expect("start the server");
        let deadline = std::time::Instant::now() + Duration::from_secs(60);
        let first = loop {
            let text = std::fs::read_to_string(log).unwrap_or_default();
            if let Some(line) = text
                .lines()
                .find(|l| l.starts_with("listening on ") && text.contains(&format!("{l}\n")))
            {
                break line.to_owned();
            }
            assert!(
                std::time::Instant::now() < deadline,
                "{} did not listen within a minute",
                log.display()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let listening: SocketAddr = first
            .strip_prefix("listening on ")
            .and_then(|a| a.parse().ok())
            .unwrap_or_else(|| panic!("not `listening on ADDR`: {first}"));
        Self {
            child,
            addr: SocketAddr::from(([127, 0, 0, 1], listening.port())),
        }
    }

    fn url(&self) -> String {
        format!("https://{}{WEBHOOK_PATH}", self.addr)
    }

    fn pid(&self) -> u32 {
        self.child.id().expect("the server runs")
    }
}

/// The webhook's user, bound to exactly the shipped ClusterRole and Role; its kubeconfig.
async fn webhook_kubeconfig(env: &TestEnv, ns: &str) -> String {
    let user = format!("system:serviceaccount:{ns}:ichor-webhook");
    let admin = env.client();
    let post = PostParams::default();
    let meta = |name: &str| ObjectMeta {
        name: Some(name.to_owned()),
        ..Default::default()
    };
    let role_ref = |kind: &str| RoleRef {
        api_group: Some("rbac.authorization.k8s.io".into()),
        kind: kind.into(),
        name: "ichor-webhook".into(),
    };
    let subjects = Some(vec![Subject {
        kind: "User".into(),
        name: user.clone(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    }]);
    Api::<ClusterRole>::all(admin.clone())
        .create(&post, &ichor_api::admission::webhook_cluster_role())
        .await
        .expect("cluster role");
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &post,
            &ClusterRoleBinding {
                metadata: meta("ichor-webhook"),
                role_ref: role_ref("ClusterRole"),
                subjects: subjects.clone(),
            },
        )
        .await
        .expect("cluster role binding");
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(&post, &ichor_api::admission::webhook_role(ns))
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(admin, ns)
        .create(
            &post,
            &RoleBinding {
                metadata: meta("ichor-webhook"),
                role_ref: role_ref("Role"),
                subjects,
            },
        )
        .await
        .expect("role binding");
    env.connection()
        .kubeconfig_for(&user, None)
        .expect("a kubeconfig")
}

/// Creates `machine` with the removal finalizer and, as the manager records an applied one, a
/// config hash and (for a control plane) a healthy etcd voter observed now. Returns the review
/// of its delete, with the stored object as `oldObject`.
async fn applied_machine(env: &TestEnv, ns: &str, machine: MachineBuilder) -> Value {
    let stored = support::create_machine(env, ns, machine, true).await;
    let name = stored.metadata.name.clone().expect("a name");
    support::machine_review(
        &format!("bench-{name}"),
        "DELETE",
        &name,
        ns,
        Some(serde_json::to_value(&stored).expect("json")),
    )
}

/// A TalosCluster `name` of three control planes, each applied and healthy (annotated for
/// deletion when `allow_delete`), and `workers` applied workers. Returns the reviews of the
/// first control plane's delete and of the first worker's (if any).
async fn cluster(
    env: &TestEnv,
    ns: &str,
    name: &str,
    allow_delete: bool,
    workers: usize,
) -> (Value, Option<Value>) {
    let cluster: DynamicObject =
        serde_json::from_value(TalosCluster::test(name).control_planes(3).json()).expect("cluster");
    api(env, ns, "TalosCluster")
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");
    let mut first_control_plane = None;
    for i in 1..=3 {
        let mut machine = TalosMachine::test(&format!("{name}-cp-{i}"))
            .cluster(name)
            .control_plane()
            .approved();
        if allow_delete {
            machine = machine.allow_delete();
        }
        let review = applied_machine(env, ns, machine).await;
        first_control_plane.get_or_insert(review);
    }
    let mut first_worker = None;
    for i in 1..=workers {
        let machine = TalosMachine::test(&format!("{name}-worker-{i}"))
            .cluster(name)
            .worker()
            .approved();
        let review = applied_machine(env, ns, machine).await;
        first_worker.get_or_insert(review);
    }
    (
        first_control_plane.expect("three control planes"),
        first_worker,
    )
}

/// Removes the removal reservations from the TalosCluster `name`: the state before a run.
async fn reset(env: &TestEnv, ns: &str, name: &str) {
    api(env, ns, "TalosCluster")
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"annotations": {
                annotations::REMOVAL_RESERVATIONS: null
            }}})),
        )
        .await
        .expect("reset the reservations");
}

/// Whether the TalosCluster `name` holds a removal reservation.
async fn reserved(env: &TestEnv, ns: &str, name: &str) -> bool {
    let cluster = api(env, ns, "TalosCluster")
        .get(name)
        .await
        .expect("the cluster");
    cluster
        .metadata
        .annotations
        .is_some_and(|a| a.contains_key(annotations::REMOVAL_RESERVATIONS))
}

/// The webhook's answer to `review`, decided in this process on the same live state (through
/// the admin client): whether it allows, and the size of the answer in bytes as the webhook
/// serializes it.
async fn answer(guard: &Guard, review: &Value) -> (bool, usize) {
    let body = serde_json::to_vec(review).expect("json");
    let answer = ichor_webhook::server::review(guard, &body).await;
    let allowed = answer.response.as_ref().is_some_and(|r| r.allowed);
    (allowed, serde_json::to_vec(&answer).expect("json").len())
}

/// CPU time used so far by the process `pid`, in seconds (user and system).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // The fields after the command name (which may hold spaces), from the third on.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    let ticks = |i: usize| fields.get(i).and_then(|f| f.parse::<f64>().ok());
    // utime and stime are fields 14 and 15 of the whole line: 11 and 12 of these.
    (ticks(11).unwrap_or(0.0) + ticks(12).unwrap_or(0.0)) / TICKS_PER_SECOND
}

/// What one measured run gave.
#[derive(Debug)]
struct Figures {
    /// Requests answered per second.
    per_second: f64,
    /// Median latency, in seconds.
    p50: f64,
    /// 99th percentile latency, in seconds.
    p99: f64,
    /// Requests answered.
    requests: u64,
    /// CPU cores used on average by each watched process, in the order given.
    cores: Vec<f64>,
    /// Writes to etcd during the run (by anyone: the apiserver writes its leases too).
    etcd_writes: u64,
}

/// How to drive one target.
struct Load<'a> {
    client: kube::Client,
    /// The 1-minute load average before the first run.
    load_average: String,
    oha: &'a Path,
    seconds: u64,
    concurrency: u64,
    dir: &'a Path,
}

impl Load<'_> {
    /// Runs `oha` for `seconds` against `url` with the bodies `bodies` (each request one of
    /// them at random); parses its JSON summary.
    async fn oha(&self, url: &str, bodies: &[Value], seconds: u64) -> Value {
        let file = self.dir.join("bodies.jsonl");
        let lines: Vec<String> = bodies.iter().map(Value::to_string).collect();
        std::fs::write(&file, lines.join("\n") + "\n").expect("write the bodies");
        let output = tokio::process::Command::new(self.oha)
            .args(["--no-tui", "--output-format", "json", "--insecure", "-w"])
            .args(["-m", "POST", "-T", "application/json"])
            .args(["-c", &self.concurrency.to_string()])
            .args(["-z", &format!("{seconds}s")])
            .arg("-Z")
            .arg(&file)
            .arg(url)
            .stdin(Stdio::null())
            .output()
            .await
            .expect("run oha");
        assert!(
            output.status.success(),
            "oha failed: {}",
            String::from_utf8_lossy(&output.stderr)
        );
        serde_json::from_slice(&output.stdout).unwrap_or_else(|e| {
            panic!(
                "oha's JSON: {e}: {}",
                String::from_utf8_lossy(&output.stdout)
            )
        })
    }

    /// `before`, a warm-up run, `before` again, then a measured one; the CPU time of `watched`
    /// and etcd's revision are taken around it.
    async fn measure(
        &self,
        url: &str,
        bodies: &[Value],
        watched: &[u32],
        before: impl AsyncFn(),
    ) -> Figures {
        before().await;
        self.oha(url, bodies, WARM_UP_SECONDS).await;
        before().await;
        let cpu: Vec<f64> = watched.iter().map(|&pid| cpu_seconds(pid)).collect();
        let revision = self.revision().await;
        let started = std::time::Instant::now();
        let summary = self.oha(url, bodies, self.seconds).await;
        let elapsed = started.elapsed().as_secs_f64();
        let writes = self.revision().await - revision;
        let cores = watched
            .iter()
            .zip(cpu)
            .map(|(&pid, before)| (cpu_seconds(pid) - before) / elapsed)
            .collect();
        figures(&summary, cores, writes)
    }

    /// etcd's revision now (it grows by one with every write), from a consistent list.
    async fn revision(&self) -> u64 {
        Api::<Namespace>::all(self.client.clone())
            .list_metadata(&ListParams::default().limit(1))
            .await
            .expect("list namespaces")
            .metadata
            .resource_version
            .and_then(|v| v.parse().ok())
            .expect("a revision")
    }
}

/// The figures of `oha`'s JSON summary; every answer must have been a 200.
fn figures(summary: &Value, cores: Vec<f64>, etcd_writes: u64) -> Figures {
    let codes = summary["statusCodeDistribution"]
        .as_object()
        .expect("oha's status codes");
    let requests: u64 = codes.values().filter_map(Value::as_u64).sum();
    let ok = codes.get("200").and_then(Value::as_u64).unwrap_or(0);
    assert!(
        requests > 0 && ok == requests,
        "every answer is a 200: {summary}"
    );
    let errors = summary["errorDistribution"]
        .as_object()
        .map_or(0, |e| e.values().filter_map(Value::as_u64).sum::<u64>());
    assert_eq!(errors, 0, "no request failed: {summary}");
    let number = |value: &Value| {
        value
            .as_f64()
            .unwrap_or_else(|| panic!("a number: {summary}"))
    };
    Figures {
        per_second: number(&summary["summary"]["requestsPerSec"]),
        p50: number(&summary["latencyPercentiles"]["p50"]),
        p99: number(&summary["latencyPercentiles"]["p99"]),
        requests,
        cores,
        etcd_writes,
    }
}

/// The reviews of both mixes, checked against the live state: mix A's control-plane delete
/// is refused and its worker delete allowed, mix B's delete allowed (and reserved, then reset).
struct Mixes {
    a: Vec<Value>,
    b: Vec<Value>,
    /// The size of the answers to mix A's reviews, in bytes (the echo's answer size).
    a_answer_bytes: Vec<usize>,
    /// The size of the answer to mix B's review, in bytes.
    b_answer_bytes: usize,
}

async fn mixes(env: &TestEnv, ns: &str) -> Mixes {
    let (refused, worker) = cluster(env, ns, "lab", false, 2).await;
    let worker = worker.expect("a worker");
    let (reserving, _) = cluster(env, ns, "prod", true, 0).await;
    let guard = Guard::new(env.client());
    let (allowed, refused_bytes) = answer(&guard, &refused).await;
    assert!(!allowed, "an unannotated control plane's delete is refused");
    let (allowed, worker_bytes) = answer(&guard, &worker).await;
    assert!(allowed, "a worker's delete is allowed");
    assert!(!reserved(env, ns, "lab").await, "and nothing is reserved");
    let (allowed, b_answer_bytes) = answer(&guard, &reserving).await;
    assert!(allowed, "an annotated control plane's delete is allowed");
    assert!(reserved(env, ns, "prod").await, "and reserved");
    reset(env, ns, "prod").await;
    Mixes {
        a: vec![refused, worker],
        b: vec![reserving],
        a_answer_bytes: vec![refused_bytes, worker_bytes],
        b_answer_bytes,
    }
}

fn milliseconds(seconds: f64) -> String {
    format!("{:.2} ms", seconds * 1000.0)
}

/// The report's table.
fn table(echo: &Figures, a: &Figures, b: &Figures, mixes: &Mixes, load: &Load<'_>) -> String {
    let row = |name: &str, f: &Figures| {
        let cores: Vec<String> = f.cores.iter().map(|c| format!("{c:.2}")).collect();
        format!(
            "| {name} | {:.0} | {} | {} | {:.3}× | {:.2}× | {} | {} | {} |\n",
            f.per_second,
            milliseconds(f.p50),
            milliseconds(f.p99),
            f.per_second / echo.per_second,
            f.p99 / echo.p99,
            f.requests,
            f.etcd_writes,
            cores.join(" / ")
        )
    };
    let goal_rate = a.per_second >= 2000.0;
    let goal_p99 = a.p99 <= 3.0 * echo.p99;
    format!(
        "{} connections, {} s per run after a {WARM_UP_SECONDS} s warm-up; the machine's 1-minute \
         load average was {} when the runs began. Answer sizes: mix A \
         {:?} bytes (refusal, worker), mix B {} bytes; the echo answers {} bytes.\n\n\
         | target | reviews/s | p50 | p99 | rate ÷ echo | p99 ÷ echo | requests | etcd writes | CPU cores: server / apiserver / etcd |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---|\n{}{}{}\n\
         Goal for mix A: ≥ 2000 reviews/s ({}), p99 ≤ 3× the echo's ({}: {} against {}). \
         Mix B is reported only.\n",
        load.concurrency,
        load.seconds,
        load.load_average,
        mixes.a_answer_bytes,
        mixes.b_answer_bytes,
        echo_bytes(mixes),
        row("TLS echo (the limit)", echo),
        row("ichor-webhook, mix A", a),
        row("ichor-webhook, mix B", b),
        if goal_rate { "met" } else { "missed" },
        if goal_p99 { "met" } else { "missed" },
        milliseconds(a.p99),
        milliseconds(echo.p99),
    )
}

/// The echo's answer size: the mean of mix A's answers.
fn echo_bytes(mixes: &Mixes) -> usize {
    mixes.a_answer_bytes.iter().sum::<usize>() / mixes.a_answer_bytes.len().max(1)
}

#[tokio::test]
async fn the_webhook_under_load_beside_a_bare_tls_server() {
    let report = env_path("ICHOR_WEBHOOK_BENCH_REPORT");
    let plane = ControlPlane::start().await.expect("a control plane");
    let [etcd, apiserver] = plane.pids();
    let env = TestEnv::from_control_plane(plane).await.expect("a client");
    env.install_crds(ichor_api::crds()).await.expect("CRDs");
    let ns = env.namespace("bench").await.expect("namespace");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let kubeconfig = dir.path().join("kubeconfig");
    std::fs::write(&kubeconfig, webhook_kubeconfig(&env, &ns).await).expect("kubeconfig");
    let mixes = mixes(&env, &ns).await;

    let mut echo = tokio::process::Command::new(env_path("ICHOR_TLS_ECHO_BIN"));
    echo.args(["--body-bytes", &echo_bytes(&mixes).to_string()]);
    let echo = Server::start(echo, &dir.path().join("echo.log")).await;
    let mut webhook = tokio::process::Command::new(env_path("ICHOR_WEBHOOK_BIN"));
    webhook
        .args(["--namespace", &ns, "--pod-ip", "127.0.0.1", "--port", "0"])
        .env("KUBECONFIG", &kubeconfig);
    let webhook = Server::start(webhook, &dir.path().join("webhook.log")).await;

    let oha = env_path("ICHOR_OHA_BIN");
    let load = Load {
        client: env.client(),
        load_average: std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().map(str::to_owned))
            .unwrap_or_else(|| "unknown".to_owned()),
        oha: &oha,
        seconds: env_number("ICHOR_WEBHOOK_BENCH_SECONDS", SECONDS),
        concurrency: env_number("ICHOR_WEBHOOK_BENCH_CONCURRENCY", CONCURRENCY),
        dir: dir.path(),
    };
    let echo_figures = load
        .measure(
            &echo.url(),
            &mixes.a,
            &[echo.pid(), apiserver, etcd],
            async || {},
        )
        .await;
    let watched = [webhook.pid(), apiserver, etcd];
    let a = load
        .measure(&webhook.url(), &mixes.a, &watched, async || {})
        .await;
    assert!(!reserved(&env, &ns, "lab").await, "mix A reserved nothing");
    let b = load
        .measure(&webhook.url(), &mixes.b, &watched, async || {
            reset(&env, &ns, "prod").await;
        })
        .await;
    assert!(reserved(&env, &ns, "prod").await, "mix B reserved");
    let table = table(&echo_figures, &a, &b, &mixes, &load);
    println!("\n{table}");
    std::fs::write(&report, table).expect("write the report");
}
