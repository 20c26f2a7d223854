//! The manager's `/metrics` scraped over HTTP and read with a Prometheus text parser: the
//! reconcile-duration and Talos RPC histograms carry their buckets, sum and count with the
//! right labels once work was done, and machines are counted by namespace.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::common::LocalObjectReference;
use ichor_api::machine::{ApprovalState, TalosMachineSpec};
use ichor_manager::infra::http::{Health, serve};
use ichor_manager::{Context, Metrics, Settings};
use ichor_sim::SimNode;
use ichor_talos::TalosClient;
use ichor_testenv::TestEnv;
use kube::api::{Api, PostParams};
use prometheus_parse::{Sample, Scrape, Value};

/// The body of `/metrics`, and what the parser reads in it.
async fn scrape(addr: SocketAddr) -> (String, Scrape) {
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    stream
        .write_all(b"GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        .await
        .expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read");
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    assert!(
        head.to_ascii_lowercase()
            .contains("content-type: text/plain; version=0.0.4"),
        "{head}"
    );
    let parsed = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text");
    (body.to_owned(), parsed)
}

fn labels(sample: &Sample) -> BTreeMap<&str, &str> {
    sample
        .labels
        .iter()
        .map(|(k, v)| (k.as_str(), v.as_str()))
        .collect()
}

/// The histogram `name` with exactly `want` among its labels: its buckets, and its count.
fn histogram(scrape: &Scrape, name: &str, want: &[(&str, &str)]) -> Option<(usize, f64)> {
    let sample = scrape.samples.iter().find(|s| {
        s.metric == name && {
            let have = labels(s);
            want.iter().all(|(k, v)| have.get(k) == Some(v))
        }
    })?;
    match &sample.value {
        Value::Histogram(buckets) => {
            let count = buckets.last().map_or(0.0, |b| b.count);
            Some((buckets.len(), count))
        }
        _ => None,
    }
}

/// Whether `text` has a sample of `series` with `label` (the parser folds `_bucket`, `_sum`
/// and `_count` into one histogram; this checks that each is exposed).
fn has_series(text: &str, series: &str, label: &str) -> bool {
    text.lines()
        .any(|l| l.starts_with(&format!("{series}{{")) && l.contains(label))
}

fn pending_machine(name: &str) -> TalosMachine {
    TalosMachine::new(
        name,
        TalosMachineSpec {
            cluster_ref: LocalObjectReference { name: "lab".into() },
            role: None,
            approval_state: ApprovalState::Pending,
            endpoints: Vec::new(),
            fingerprint: None,
            hostname: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            bmc: None,
        },
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn histograms_and_the_machine_gauge_are_scraped_after_work() {
    let env = TestEnv::private().await.expect("private control plane");
    env.install_crds(ichor_api::crds()).await.expect("CRDs");
    let ns = env.namespace("metrics").await.expect("namespace");
    let metrics = Arc::new(Metrics::default());
    let addr = serve(
        ([127, 0, 0, 1], 0).into(),
        Arc::clone(&metrics),
        Arc::new(Health::default()),
    )
    .await
    .expect("serve");
    let ctx = Arc::new(Context::new(
        env.client(),
        Settings::default(),
        Arc::clone(&metrics),
    ));
    let (stop_tx, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let manager = tokio::spawn(ichor_manager::run(ctx, async {
        let _ = stop_rx.await;
    }));

    Api::<TalosMachine>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &pending_machine("m1"))
        .await
        .expect("a machine");
    // A Talos call made while the manager runs is timed into its metrics.
    let node = SimNode::start("127.0.0.1:0".parse().expect("addr"), "v1.14.1")
        .await
        .expect("sim node");
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("maintenance connection");
    assert_eq!(client.version().await.expect("version"), "v1.14.1");

    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let (body, scrape) = loop {
        let (body, scrape) = scrape(addr).await;
        let reconciled = histogram(
            &scrape,
            "ichor_reconcile_duration_seconds",
            &[("kind", "TalosMachine")],
        )
        .is_some_and(|(_, count)| count >= 1.0);
        let counted = scrape.samples.iter().any(|s| {
            s.metric == "ichor_machines" && labels(s).get("namespace") == Some(&ns.as_str())
        });
        if reconciled && counted {
            break (body, scrape);
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no reconcile histogram or machine gauge in {:?}",
            scrape.samples
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    let (buckets, _) = histogram(
        &scrape,
        "ichor_reconcile_duration_seconds",
        &[("kind", "TalosMachine")],
    )
    .expect("reconcile histogram");
    assert!(buckets > 1, "buckets up to +Inf");
    let (_, calls) = histogram(
        &scrape,
        "ichor_talos_rpc_duration_seconds",
        &[
            ("service", "machine.MachineService"),
            ("method", "Version"),
            ("code", "Ok"),
        ],
    )
    .expect("Talos RPC histogram");
    assert_eq!(calls, 1.0, "one Version call");
    for (series, label) in [
        (
            "ichor_reconcile_duration_seconds_bucket",
            "kind=\"TalosMachine\"",
        ),
        (
            "ichor_reconcile_duration_seconds_sum",
            "kind=\"TalosMachine\"",
        ),
        (
            "ichor_reconcile_duration_seconds_count",
            "kind=\"TalosMachine\"",
        ),
        (
            "ichor_talos_rpc_duration_seconds_bucket",
            "method=\"Version\"",
        ),
        ("ichor_talos_rpc_duration_seconds_sum", "method=\"Version\""),
        (
            "ichor_talos_rpc_duration_seconds_count",
            "method=\"Version\"",
        ),
    ] {
        assert!(
            has_series(&body, series, label),
            "no {series}{{{label}}} in {body}"
        );
    }
    let leader = scrape
        .samples
        .iter()
        .find(|s| s.metric == "ichor_leader")
        .expect("the leader gauge");
    assert_eq!(leader.value, Value::Gauge(0.0), "run alone does not lead");

    let _ = stop_tx.send(());
    manager.await.expect("manager stops");
    node.stop().await;
}
