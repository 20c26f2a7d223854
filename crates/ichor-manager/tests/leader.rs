//! Leader election on a real Lease, and the metrics endpoint.

use std::sync::Arc;
use std::time::Duration;

use ichor_manager::Metrics;
use ichor_manager::infra::http::{Health, serve};
use ichor_manager::infra::leader::{LeaseSettings, renewed_while, try_acquire};
use ichor_testenv::TestEnv;
use ichor_testenv::wait::eventually;

fn lease(namespace: &str, identity: &str) -> LeaseSettings {
    LeaseSettings {
        namespace: namespace.into(),
        name: "ichor-manager".into(),
        identity: identity.into(),
        duration: Duration::from_secs(2),
        retry: Duration::from_millis(400),
    }
}

#[tokio::test]
async fn one_replica_leads_until_its_lease_expires() {
    let env = TestEnv::shared().await.expect("control plane");
    let ns = env.namespace("lease").await.expect("namespace");
    let client = env.client();
    assert!(try_acquire(&client, &lease(&ns, "a")).await.expect("a"));
    assert!(
        !try_acquire(&client, &lease(&ns, "b")).await.expect("b"),
        "a holds it"
    );
    assert!(
        try_acquire(&client, &lease(&ns, "a"))
            .await
            .expect("a renews")
    );
    // b keeps asking; it gets the Lease once a's 2 s term has run out, and not before.
    let renewed = std::time::Instant::now();
    eventually(
        "b to take over after a's lease expires",
        Duration::from_secs(10),
        || async { try_acquire(&client, &lease(&ns, "b")).await.expect("b") },
    )
    .await;
    assert!(
        renewed.elapsed() >= Duration::from_millis(1500),
        "b took over {:?} after a renewed a 2 s lease",
        renewed.elapsed()
    );
    assert!(
        !try_acquire(&client, &lease(&ns, "a")).await.expect("a"),
        "b holds it now"
    );
}

#[tokio::test]
async fn a_long_step_keeps_its_lease_renewed() {
    let env = TestEnv::shared().await.expect("control plane");
    let ns = env.namespace("long-step").await.expect("namespace");
    let client = env.client();
    assert!(try_acquire(&client, &lease(&ns, "a")).await.expect("a"));
    // A step of two and a half lease terms: without renewal b would take over after one.
    let contested = renewed_while(&client, lease(&ns, "a"), async {
        let mut b_won = false;
        for _ in 0..10 {
            tokio::time::sleep(Duration::from_millis(500)).await;
            b_won |= try_acquire(&client, &lease(&ns, "b")).await.expect("b");
        }
        b_won
    })
    .await;
    assert!(!contested, "the lease stayed a's for the whole step");
    // Once the step is over, nobody renews: b takes over after the term.
    eventually(
        "b to take over after the step",
        Duration::from_secs(10),
        || async {
            try_acquire(&client, &lease(&ns, "b"))
                .await
                .unwrap_or(false)
        },
    )
    .await;
}

#[tokio::test]
async fn metrics_and_probes_answer() {
    let metrics = Arc::new(Metrics::default());
    metrics.reconciled("TalosMachine", Duration::from_millis(5));
    metrics.error("KubernetesAPI");
    let health = Arc::new(Health::default());
    let addr = serve(
        ([127, 0, 0, 1], 0).into(),
        Arc::clone(&metrics),
        Arc::clone(&health),
    )
    .await
    .expect("serve");
    let get = |path: &'static str| async move {
        use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
        let mut s = tokio::net::TcpStream::connect(addr).await.expect("connect");
        s.write_all(
            format!("GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n").as_bytes(),
        )
        .await
        .expect("write");
        let mut reply = String::new();
        s.read_to_string(&mut reply).await.expect("read");
        reply
    };
    let text = get("/metrics").await;
    assert!(
        text.contains("ichor_reconciles_total{kind=\"TalosMachine\"} 1"),
        "{text}"
    );
    assert!(
        text.contains("ichor_reconcile_errors_total{reason=\"KubernetesAPI\"} 1"),
        "{text}"
    );
    assert!(get("/healthz").await.starts_with("HTTP/1.1 200"));
    assert!(
        get("/readyz").await.starts_with("HTTP/1.1 503"),
        "not ready before start"
    );
    health
        .ready
        .store(true, std::sync::atomic::Ordering::SeqCst);
    assert!(get("/readyz").await.starts_with("HTTP/1.1 200"));
}
