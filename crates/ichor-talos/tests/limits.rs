//! Per-method limits and progress, against simulated control planes made slow with
//! `Fault::SlowMethod`: a quick read still fails at its short limit, a defragment longer than
//! that finishes within its own, a snapshot streams for as long as bytes keep coming and fails
//! once they stop for longer than its idle limit; and the progress pulls, upgrades and
//! snapshots report. The limits are scaled down (1 s quick, 4 s long) to keep the tests short,
//! except in the one that shows a defragment outlasting the old 10 s limit of every call.

mod support;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ichor_api::common::Role;
use ichor_sim::{Fault, Hardware, NodeSpec, SimNode};
use ichor_talos::{Category, LayerStatus, LimitKind, Limits, Progress, TalosClient, TalosError};
use ichor_testenv::nets::TALOS_LIMITS;
use support::{NodeConfig, admin, bundle_for, node_config};

/// The limits these tests hold calls to.
fn scaled() -> Limits {
    Limits {
        quick: Duration::from_secs(1),
        long: Duration::from_secs(4),
        snapshot_idle: Duration::from_secs(1),
        ..Limits::default()
    }
}

/// A bootstrapped control plane on 127.0.150.`host` whose cluster holds about 256 KiB, and a
/// client of it held to `limits`.
async fn control_plane(host: u8, limits: Limits) -> (SimNode, TalosClient) {
    let b = bundle_for(150);
    let addr = SocketAddr::from((TALOS_LIMITS.ip(0, host), 50000));
    let config = node_config(
        &b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: "v1.14.1",
            endpoint_host: &addr.ip().to_string(),
            hostname: Some(&format!("cp-{host}")),
            cni: "flannel",
            install: true,
        },
    );
    let node = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(150 * 256 + u32::from(host)),
        config: Some(config),
        etcd_size: 256 << 10,
        ..NodeSpec::new(addr, "v1.14.1")
    })
    .await
    .expect("start");
    let client = admin(&b, node.addr()).await.with_limits(limits);
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    (node, client)
}

fn slow(method: &'static str, before: Duration, between: Duration) -> Fault {
    Fault::SlowMethod {
        method,
        before,
        between,
    }
}

/// The method, kind and limit of a [`TalosError::Timeout`], or a panic naming the error.
fn timed_out(error: &TalosError) -> (&'static str, LimitKind, Duration) {
    match error {
        TalosError::Timeout {
            method,
            kind,
            limit,
            ..
        } => (method, *kind, *limit),
        other => panic!("expected a timeout, got {other:?}"),
    }
}

#[tokio::test]
async fn a_quick_read_still_times_out_at_its_short_limit() {
    let (node, client) = control_plane(1, scaled()).await;
    node.inject(slow("Version", Duration::from_secs(3), Duration::ZERO))
        .await
        .expect("fault");
    let started = Instant::now();
    let error = client.version().await.expect_err("slower than its limit");
    let took = started.elapsed();
    assert_eq!(
        timed_out(&error),
        ("Version", LimitKind::Overall, Duration::from_secs(1))
    );
    assert!(took < Duration::from_millis(2500), "cut at 1 s: {took:?}");
    let text = error.to_string();
    let on = format!("Version on {}:50000", TALOS_LIMITS.ip(0, 1));
    assert!(text.starts_with(&on), "{text}");
    assert!(text.contains("1s, its overall limit"), "{text}");
    assert_eq!(error.code(), Some(tonic::Code::DeadlineExceeded));
    assert_eq!(error.category(), Category::Transient);

    // Only that method is slow; a COSI read made slow is cut at the quick limit too.
    assert_eq!(client.hostname().await.expect("hostname"), "cp-1");
    node.inject(slow("Get", Duration::from_secs(3), Duration::ZERO))
        .await
        .expect("fault");
    let error = client.machine_status().await.expect_err("slow");
    assert_eq!(
        timed_out(&error),
        ("COSI Get", LimitKind::Overall, Duration::from_secs(1))
    );

    // Both waits zero end the fault.
    node.inject(slow("Version", Duration::ZERO, Duration::ZERO))
        .await
        .expect("fault");
    assert_eq!(client.version().await.expect("version"), "v1.14.1");
    node.stop().await;
}

#[tokio::test]
async fn a_defragment_past_the_quick_limit_finishes_within_its_own() {
    let (node, client) = control_plane(2, scaled()).await;
    node.inject(slow(
        "EtcdDefragment",
        Duration::from_millis(2500),
        Duration::ZERO,
    ))
    .await
    .expect("fault");
    let started = Instant::now();
    client.etcd_defragment().await.expect("within 4 s");
    assert!(started.elapsed() >= Duration::from_millis(2500));

    node.inject(slow(
        "EtcdDefragment",
        Duration::from_secs(6),
        Duration::ZERO,
    ))
    .await
    .expect("fault");
    let error = client.etcd_defragment().await.expect_err("past 4 s");
    assert_eq!(
        timed_out(&error),
        ("EtcdDefragment", LimitKind::Overall, Duration::from_secs(4))
    );
    node.stop().await;
}

#[tokio::test]
async fn a_defragment_past_the_old_ten_seconds_succeeds_with_the_default_limits() {
    let (node, client) = control_plane(3, Limits::default()).await;
    node.inject(slow(
        "EtcdDefragment",
        Duration::from_secs(11),
        Duration::ZERO,
    ))
    .await
    .expect("fault");
    let started = Instant::now();
    client.etcd_defragment().await.expect("within 5 min");
    assert!(started.elapsed() >= Duration::from_secs(11));
    node.stop().await;
}

/// Records every progress report.
fn recorder() -> (Arc<Mutex<Vec<Progress>>>, impl FnMut(&Progress) + Send) {
    let seen = Arc::new(Mutex::new(Vec::new()));
    let sink = Arc::clone(&seen);
    (seen, move |p: &Progress| {
        sink.lock().expect("lock").push(p.clone());
    })
}

fn received(seen: &Mutex<Vec<Progress>>) -> Vec<u64> {
    seen.lock()
        .expect("lock")
        .iter()
        .map(|p| match p {
            Progress::Received(n) => *n,
            other => panic!("a snapshot reports bytes, not {other:?}"),
        })
        .collect()
}

#[tokio::test]
async fn a_snapshot_streams_past_every_limit_while_bytes_keep_coming() {
    let (node, client) = control_plane(4, scaled()).await;
    // Every piece is 0.3 s after the last, well within the 1 s idle limit; the whole takes
    // longer than the quick limit and the idle limit together.
    node.inject(slow(
        "EtcdSnapshot",
        Duration::from_millis(500),
        Duration::from_millis(300),
    ))
    .await
    .expect("fault");
    let (seen, progress) = recorder();
    let started = Instant::now();
    let snapshot = client
        .etcd_snapshot_with_progress(progress)
        .await
        .expect("no silence longer than 1 s");
    let took = started.elapsed();
    assert!(took > Duration::from_secs(2), "slowed down: {took:?}");
    assert_eq!(snapshot.len() % 512, 32, "talosctl's trailer check");
    let received = received(&seen);
    assert!(received.len() > 1, "{received:?}");
    assert!(received.windows(2).all(|w| w[0] < w[1]), "{received:?}");
    assert_eq!(received.last().copied(), Some(snapshot.len() as u64));
    node.stop().await;
}

#[tokio::test]
async fn a_stalled_snapshot_fails_naming_the_method_and_its_idle_limit() {
    let (node, client) = control_plane(5, scaled()).await;
    // The first piece comes at once, the next after 3 s: a stall in the middle.
    node.inject(slow("EtcdSnapshot", Duration::ZERO, Duration::from_secs(3)))
        .await
        .expect("fault");
    let (seen, progress) = recorder();
    let started = Instant::now();
    let error = client
        .etcd_snapshot_with_progress(progress)
        .await
        .expect_err("stalled");
    let took = started.elapsed();
    assert_eq!(
        timed_out(&error),
        ("EtcdSnapshot", LimitKind::Idle, Duration::from_secs(1))
    );
    assert!(
        took < Duration::from_millis(2500),
        "cut at 1 s idle: {took:?}"
    );
    let text = error.to_string();
    assert!(
        text.contains("EtcdSnapshot") && text.contains("sent nothing for 1s, its idle limit"),
        "{text}"
    );
    assert!(
        received(&seen).last().is_some_and(|&n| n > 0),
        "bytes came before the stall"
    );

    // A stream that never starts fails the same way.
    node.inject(slow("EtcdSnapshot", Duration::from_secs(3), Duration::ZERO))
        .await
        .expect("fault");
    let error = client.etcd_snapshot().await.expect_err("never started");
    assert_eq!(
        timed_out(&error),
        ("EtcdSnapshot", LimitKind::Idle, Duration::from_secs(1))
    );
    node.stop().await;
}

#[tokio::test]
async fn pulls_and_upgrades_report_what_the_node_streams() {
    let (node, client) = control_plane(6, scaled()).await;
    let image = "ghcr.io/siderolabs/installer:v1.14.2";
    let (seen, progress) = recorder();
    assert_eq!(
        client
            .pull_image_with_progress(image, progress)
            .await
            .expect("pull"),
        image
    );
    let layers: Vec<_> = seen
        .lock()
        .expect("lock")
        .iter()
        .map(|p| match p {
            Progress::Layer(layer) => layer.clone(),
            other => panic!("a pull reports layers, not {other:?}"),
        })
        .collect();
    assert_eq!(
        layers.iter().map(|l| l.status).collect::<Vec<_>>(),
        [
            LayerStatus::Downloading,
            LayerStatus::DownloadComplete,
            LayerStatus::ExtractComplete
        ]
    );
    assert!(layers[0].offset > 0 && layers[0].offset < layers[0].total);
    assert!(layers.iter().all(|l| l.layer == layers[0].layer));

    // An image the node has already is not pulled again: nothing to report.
    let (again, progress) = recorder();
    client
        .pull_image_with_progress(image, progress)
        .await
        .expect("pull");
    assert_eq!(again.lock().expect("lock").len(), 0);

    let (seen, progress) = recorder();
    client
        .upgrade_with_progress(image, progress)
        .await
        .expect("upgrade");
    let messages = seen.lock().expect("lock").clone();
    assert_eq!(
        messages,
        [
            Progress::Message(format!("upgrading from {image}")),
            Progress::Message("installation complete".into()),
        ]
    );
    node.stop().await;
}
