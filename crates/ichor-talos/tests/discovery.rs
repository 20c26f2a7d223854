//! The discovery sweep over four /24s: 16 simulated maintenance-mode nodes, a plain TLS server
//! and a TCP listener that never speaks TLS; and which of them asks for a client certificate.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ichor_sim::{Hardware, SimNode};
use ichor_talos::discovery::{ProbeOutcome, SweepConfig, sweep, sweep_sharing};
use ichor_testenv::nets::TALOS_DISCOVERY as NETS;
use tokio::net::TcpListener;

mod support;

/// How long a probe may take to reach a node, or the sweeps to finish.
const WAIT: Duration = Duration::from_secs(10);

/// A TLS server that is not Talos: it completes handshakes, then says nothing useful.
async fn plain_tls_server(addr: SocketAddr) {
    let key = rcgen::KeyPair::generate().expect("key");
    let cert = rcgen::CertificateParams::new(vec!["plain".to_owned()])
        .expect("params")
        .self_signed(&key)
        .expect("cert");
    let config = rustls::ServerConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("versions")
    .with_no_client_auth()
    .with_single_cert(
        vec![cert.der().clone()],
        rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
    )
    .expect("server config");
    let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
    let listener = TcpListener::bind(addr).await.expect("bind plain TLS");
    tokio::spawn(async move {
        while let Ok((tcp, _)) = listener.accept().await {
            let acceptor = acceptor.clone();
            tokio::spawn(async move {
                if let Ok(mut tls) = acceptor.accept(tcp).await {
                    use tokio::io::AsyncWriteExt as _;
                    let _ = tls.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n").await;
                }
            });
        }
    });
}

/// A TCP listener that accepts and then stays silent.
async fn silent_tcp_listener(addr: SocketAddr) {
    let listener = TcpListener::bind(addr).await.expect("bind silent TCP");
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((tcp, _)) = listener.accept().await {
            held.push(tcp);
        }
    });
}

#[tokio::test]
async fn a_sweep_finds_the_maintenance_nodes_and_classifies_the_rest() {
    let mut nodes = Vec::new();
    for i in 0..4u8 {
        for host in 1..=4u8 {
            let seed = u32::from(i) * 4 + u32::from(host);
            let addr = SocketAddr::from((NETS.ip(i, host), 50000));
            nodes.push(
                SimNode::start_with(addr, "v1.14.1", Hardware::vm(seed))
                    .await
                    .expect("start a simulated node"),
            );
        }
    }
    plain_tls_server(SocketAddr::from((NETS.ip(2, 200), 50000))).await;
    silent_tcp_listener(SocketAddr::from((NETS.ip(3, 200), 50000))).await;

    let cidrs: Vec<String> = (0..4).map(|i| format!("{}/24", NETS.ip(i, 0))).collect();
    let config = SweepConfig {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    let probes = sweep(&cidrs, config).await.expect("sweep");

    let mut found = Vec::new();
    let mut other = Vec::new();
    for probe in &probes {
        match &probe.outcome {
            ProbeOutcome::Maintenance(f) => found.push(f.clone()),
            outcome => other.push((probe.address, outcome.clone())),
        }
    }
    assert_eq!(found.len(), 16, "exactly the simulated nodes: {other:?}");
    for node in &nodes {
        let ip = match node.addr() {
            SocketAddr::V4(v4) => *v4.ip(),
            SocketAddr::V6(_) => unreachable!("IPv4 only"),
        };
        let f = found.iter().find(|f| f.address == ip).expect("node found");
        assert_eq!(f.inventory.uuid, node.hardware().uuid);
        assert_eq!(f.fingerprint, node.fingerprint());
        assert_eq!(f.version, "v1.14.1");
    }
    assert_eq!(other.len(), 2, "{other:?}");
    assert_eq!(other[0].0, NETS.ip(2, 200));
    assert!(
        matches!(other[0].1, ProbeOutcome::NotTalos { .. }),
        "{other:?}"
    );
    assert_eq!(other[1], (NETS.ip(3, 200), ProbeOutcome::NoTls));
    for node in nodes {
        node.stop().await;
    }
}

#[tokio::test]
async fn sweeps_sharing_a_pool_probe_only_with_its_permits() {
    let mut nodes = Vec::new();
    for host in 1..=2u8 {
        let addr = SocketAddr::from((NETS.ip(4, host), 50000));
        nodes.push(
            SimNode::start_with(addr, "v1.14.1", Hardware::vm(100 + u32::from(host)))
                .await
                .expect("start a simulated node"),
        );
    }
    let config = SweepConfig {
        timeout: Duration::from_millis(500),
        ..Default::default()
    };
    // Each node holds the probe's first Talos call until the test has looked at the pool.
    let [one, two] = [nodes[0].gate("Version"), nodes[1].gate("Version")];
    // A pool of one permit: two sweeps, however large their own concurrency, probe one
    // address at a time.
    let pool = Arc::new(tokio::sync::Semaphore::new(1));
    let sweeps = tokio::spawn({
        let pool = Arc::clone(&pool);
        async move {
            let (one, two) = (
                [format!("{}/32", NETS.ip(4, 1))],
                [format!("{}/32", NETS.ip(4, 2))],
            );
            let first = sweep_sharing(&one, config, &pool);
            let second = sweep_sharing(&two, config, &pool);
            let (first, second) = tokio::join!(first, second);
            (first.expect("sweep"), second.expect("sweep"))
        }
    });
    // Whenever a probe is in a node, it holds the pool's only permit: no probe runs without
    // one, and the other sweep's probe waits for it.
    let first_in_one = tokio::time::timeout(WAIT, async {
        tokio::select! {
            () = one.arrived(1) => true,
            () = two.arrived(1) => false,
        }
    })
    .await
    .expect("a probe reaches a node");
    let (held, waiting) = if first_in_one { (one, two) } else { (two, one) };
    assert_eq!(pool.available_permits(), 0, "the probe holds the permit");
    assert_eq!(waiting.count(), 0, "the other probe waits for it");
    held.release();
    tokio::time::timeout(WAIT, waiting.arrived(1))
        .await
        .expect("the other probe reaches its node");
    assert_eq!(pool.available_permits(), 0, "the probe holds the permit");
    waiting.release();
    let (first, second) = tokio::time::timeout(WAIT, sweeps)
        .await
        .expect("the sweeps finish")
        .expect("join");
    for (probes, node) in [(first, &nodes[0]), (second, &nodes[1])] {
        let [probe] = probes.as_slice() else {
            panic!("one node: {probes:?}")
        };
        let ProbeOutcome::Maintenance(found) = &probe.outcome else {
            panic!("in maintenance mode: {probe:?}")
        };
        assert_eq!(found.fingerprint, node.fingerprint());
    }
    assert_eq!(pool.available_permits(), 1, "every permit is given back");
    for node in nodes {
        node.stop().await;
    }
}

/// On the last net, outside the first sweep's ranges and the second's addresses.
#[tokio::test]
async fn only_a_configured_node_asks_for_a_client_certificate() {
    use ichor_api::common::Role;
    use ichor_talos::discovery::asks_for_client_certificate;

    let maintenance = SimNode::start_with(
        SocketAddr::from((NETS.ip(4, 100), 50000)),
        "v1.14.1",
        Hardware::vm(100),
    )
    .await
    .expect("a maintenance node");
    let configured = SimNode::start_configured(
        SocketAddr::from((NETS.ip(4, 101), 50000)),
        "v1.14.1",
        Hardware::vm(101),
        &support::config(&support::bundle(), Role::ControlPlane, "v1.14.1"),
    )
    .await
    .expect("a configured node");
    plain_tls_server(SocketAddr::from((NETS.ip(4, 102), 50000))).await;
    silent_tcp_listener(SocketAddr::from((NETS.ip(4, 103), 50000))).await;

    assert_eq!(
        asks_for_client_certificate(configured.addr(), WAIT).await,
        Some(true)
    );
    assert_eq!(
        asks_for_client_certificate(maintenance.addr(), WAIT).await,
        Some(false)
    );
    let at = |host| SocketAddr::from((NETS.ip(4, host), 50000));
    assert_eq!(
        asks_for_client_certificate(at(102), WAIT).await,
        Some(false),
        "a TLS server that wants no certificate"
    );
    let short = Duration::from_millis(300);
    assert_eq!(
        asks_for_client_certificate(at(103), short).await,
        None,
        "no handshake"
    );
    assert_eq!(
        asks_for_client_certificate(at(104), short).await,
        None,
        "nothing listens"
    );
    maintenance.stop().await;
    configured.stop().await;
}
