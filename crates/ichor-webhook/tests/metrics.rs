//! The webhook's `/metrics` scraped over HTTP and read with a Prometheus text parser, after
//! reviews were sent to the running server over HTTPS: the admission-latency histogram has
//! its buckets, sum and count by resource, operation and result.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ichor_testenv::TestEnv;
use ichor_webhook::{CERT_SECRET, CertSettings, Settings, WEBHOOK_CONFIGURATION, WEBHOOK_PATH};
use prometheus_parse::{Scrape, Value};
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite, AsyncWriteExt as _};

/// Sends one HTTP/1.1 request on `stream` and reads the whole reply.
async fn exchange(mut stream: impl AsyncRead + AsyncWrite + Unpin, request: String) -> String {
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read");
    reply
}

/// POSTs `body` to the webhook on `port`, trusting only `ca_pem`.
async fn post_review(ca_pem: &str, port: u16, body: &str) -> String {
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(ca_pem.as_bytes()) {
        roots.add(cert.expect("a certificate")).expect("a root");
    }
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .expect("connect");
    let name = ServerName::IpAddress(std::net::IpAddr::from([127, 0, 0, 1]).into());
    let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(name, tcp)
        .await
        .expect("handshake");
    exchange(
        tls,
        format!(
            "POST {WEBHOOK_PATH} HTTP/1.1\r\nhost: webhook\r\ncontent-type: application/json\r\n\
             content-length: {}\r\nconnection: close\r\n\r\n{body}",
            body.len()
        ),
    )
    .await
}

async fn scrape(addr: SocketAddr) -> (String, Scrape) {
    let tcp = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let reply = exchange(
        tcp,
        "GET /metrics HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".into(),
    )
    .await;
    let (head, body) = reply.split_once("\r\n\r\n").expect("an HTTP reply");
    assert!(head.starts_with("HTTP/1.1 200"), "{head}");
    let parsed = Scrape::parse(body.lines().map(|l| Ok(l.to_owned()))).expect("Prometheus text");
    (body.to_owned(), parsed)
}

/// The count of the admission histogram with these labels, if it is there.
fn decisions(scrape: &Scrape, resource: &str, operation: &str, result: &str) -> Option<f64> {
    scrape.samples.iter().find_map(|s| {
        let labels: BTreeMap<&str, &str> = s
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let wanted = s.metric == "ichor_webhook_admission_duration_seconds"
            && labels.get("resource") == Some(&resource)
            && labels.get("operation") == Some(&operation)
            && labels.get("result") == Some(&result);
        match &s.value {
            Value::Histogram(buckets) if wanted => buckets.last().map(|b| b.count),
            _ => None,
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn admission_latency_is_scraped_by_resource_operation_and_result() {
    let env = TestEnv::shared().await.expect("control plane");
    let ns = env.namespace("webhook-metrics").await.expect("namespace");
    let certs = CertSettings {
        namespace: ns.clone(),
        service: "ichor-webhook".into(),
        pod_ip: [127, 0, 0, 1].into(),
        secret: CERT_SECRET.into(),
        webhook_configuration: format!("{WEBHOOK_CONFIGURATION}-{ns}"),
        leaf_validity: Duration::from_secs(24 * 3600),
        renew_before: Duration::from_secs(3600),
    };
    let running = ichor_webhook::start(
        env.client(),
        Settings {
            bind: ([127, 0, 0, 1], 0).into(),
            certs: certs.clone(),
            refresh: Duration::from_secs(30),
            client_auth: None,
        },
    )
    .await
    .expect("webhook starts");
    let metrics = ichor_service::serve(
        ([127, 0, 0, 1], 0).into(),
        running.metrics().registry(),
        Arc::new(ichor_service::Health::default()),
    )
    .await
    .expect("metrics endpoint");
    let ca = ichor_webhook::certs::ensure_ca(&env.client(), &certs)
        .await
        .expect("the webhook's CA");

    // A create needs no live state: allowed. An unreadable review: denied.
    let create = support::machine_review("u-1", "CREATE", "m1", &ns, None);
    let port = running.addr().port();
    for _ in 0..2 {
        let reply = post_review(&ca.cert_pem, port, &create.to_string()).await;
        assert!(reply.contains("\"allowed\":true"), "{reply}");
    }
    let reply = post_review(&ca.cert_pem, port, "not json").await;
    assert!(reply.contains("\"allowed\":false"), "{reply}");

    let (body, scrape) = scrape(metrics).await;
    assert_eq!(
        decisions(&scrape, "talosmachines", "CREATE", "allowed"),
        Some(2.0),
        "{body}"
    );
    assert_eq!(
        decisions(&scrape, "unknown", "unknown", "denied"),
        Some(1.0),
        "{body}"
    );
    for series in ["_bucket{", "_sum{", "_count{"] {
        let name = format!("ichor_webhook_admission_duration_seconds{series}");
        assert!(
            body.lines()
                .any(|l| l.starts_with(&name) && l.contains("resource=\"talosmachines\"")),
            "no {name} in {body}"
        );
    }
    running.stop().await;
}
