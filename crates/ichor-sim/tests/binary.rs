//! The `ichor-sim` binary: nodes on consecutive loopback addresses, and faults and gates
//! through its control endpoint.

use std::process::Stdio;
use std::time::Duration;

use ichor_talos::TalosClient;
use ichor_testenv::nets::SIM_BINARY;
use tokio::io::{AsyncBufReadExt as _, AsyncReadExt as _, AsyncWriteExt as _, BufReader};
use tokio::process::Command;

/// One HTTP/1.1 request to the control endpoint; returns the status line and body.
async fn http(control: &str, method: &str, path: &str) -> (String, String) {
    http_with(control, method, path, "").await
}

/// One HTTP/1.1 request with a body; returns the status line and body.
async fn http_with(control: &str, method: &str, path: &str, body: &str) -> (String, String) {
    let mut stream = tokio::net::TcpStream::connect(control)
        .await
        .expect("control endpoint");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {control}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).await.expect("read");
    let status = reply.lines().next().unwrap_or_default().to_owned();
    let body = reply
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_owned();
    (status, body)
}

#[tokio::test]
async fn the_binary_runs_nodes_and_takes_faults_through_its_control_endpoint() {
    let mut child = Command::new(env!("CARGO_BIN_EXE_ichor-sim"))
        .args([
            "--nodes",
            "3",
            "--base",
            &SIM_BINARY.ip(0, 1).to_string(),
            "--talos-version",
            "v1.14.1",
            "--control",
            "127.0.0.1:0",
            "--factory",
            "127.0.0.1:0",
        ])
        .stdout(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("spawn ichor-sim");
    let mut lines = BufReader::new(child.stdout.take().expect("stdout")).lines();
    let mut nodes = Vec::new();
    let control = loop {
        let line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
            .await
            .expect("ichor-sim starts")
            .expect("read")
            .expect("a line");
        if let Some(url) = line.strip_prefix("control http://") {
            break url.to_owned();
        }
        let words: Vec<&str> = line.split(' ').collect();
        nodes.push((
            words[1].to_owned(),
            words[3].trim_start_matches("fingerprint=").to_owned(),
        ));
    };
    // The nodes' Image Factory is announced after the control endpoint.
    let factory_line = tokio::time::timeout(Duration::from_secs(20), lines.next_line())
        .await
        .expect("the factory line")
        .expect("read")
        .expect("a line");
    let factory = factory_line
        .strip_prefix("factory http://")
        .unwrap_or_else(|| panic!("not the factory's line: {factory_line}"))
        .to_owned();
    let (status, body) = http_with(&factory, "POST", "/schematics", "customization: {}\n").await;
    assert!(status.contains("201"), "{status}");
    let created: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(created["id"], ichor_render::schematic::EMPTY_ID);
    assert_eq!(
        nodes.iter().map(|(a, _)| a.as_str()).collect::<Vec<_>>(),
        (1..=3)
            .map(|host| format!("{}:50000", SIM_BINARY.ip(0, host)))
            .collect::<Vec<_>>()
    );
    let (addr, fingerprint) = &nodes[1];
    let client = TalosClient::connect_maintenance(addr, fingerprint)
        .await
        .expect("pinned connection to a simulated node");
    assert_eq!(client.version().await.expect("version"), "v1.14.1");

    let (status, body) = http(&control, "GET", "/nodes").await;
    assert!(status.contains("200"), "{status}");
    let listed: serde_json::Value = serde_json::from_str(&body).expect("json");
    assert_eq!(listed[1]["fingerprint"], fingerprint.as_str());

    let (status, _) = http(
        &control,
        "POST",
        &format!("/nodes/{}/partition", SIM_BINARY.ip(0, 2)),
    )
    .await;
    assert!(status.contains("200"), "{status}");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), client.version())
            .await
            .is_err(),
        "partitioned"
    );
    http(
        &control,
        "POST",
        &format!("/nodes/{}/heal", SIM_BINARY.ip(0, 2)),
    )
    .await;
    client.version().await.expect("healed");

    // Cut off from clients: open connections and new ones stall, until healed.
    let (status, _) = http(
        &control,
        "POST",
        &format!("/nodes/{}/partition-from-clients", SIM_BINARY.ip(0, 2)),
    )
    .await;
    assert!(status.contains("200"), "{status}");
    assert!(
        tokio::time::timeout(Duration::from_millis(300), client.version())
            .await
            .is_err(),
        "cut off"
    );
    assert!(
        tokio::time::timeout(
            Duration::from_millis(300),
            TalosClient::connect_maintenance(addr, fingerprint)
        )
        .await
        .is_err(),
        "a new connection never completes its handshake"
    );
    http(
        &control,
        "POST",
        &format!("/nodes/{}/heal", SIM_BINARY.ip(0, 2)),
    )
    .await;
    client.version().await.expect("healed");
    TalosClient::connect_maintenance(addr, fingerprint)
        .await
        .expect("a new connection once healed")
        .version()
        .await
        .expect("answers");

    http(
        &control,
        "POST",
        &format!("/nodes/{}/gates/Version", SIM_BINARY.ip(0, 2)),
    )
    .await;
    let held = tokio::spawn({
        let client = client.clone();
        async move { client.version().await }
    });
    loop {
        let (_, body) = http(
            &control,
            "GET",
            &format!("/nodes/{}/gates/Version", SIM_BINARY.ip(0, 2)),
        )
        .await;
        if body.contains("\"arrived\":1") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert!(!held.is_finished());
    http(
        &control,
        "DELETE",
        &format!("/nodes/{}/gates/Version", SIM_BINARY.ip(0, 2)),
    )
    .await;
    held.await.expect("join").expect("released");

    let (status, body) = http(
        &control,
        "POST",
        &format!("/nodes/{}/crash", SIM_BINARY.ip(0, 9)),
    )
    .await;
    assert!(
        status.contains("400") && body.contains("no simulated node"),
        "{status} {body}"
    );
    let (status, _) = http(
        &control,
        "POST",
        &format!("/nodes/{}/restart", SIM_BINARY.ip(0, 2)),
    )
    .await;
    assert!(status.contains("200"));
    let err = TalosClient::connect_maintenance(addr, fingerprint)
        .await
        .expect_err("a restarted maintenance node has a new certificate");
    assert!(
        matches!(err, ichor_talos::TalosError::FingerprintMismatch { .. }),
        "{err}"
    );
    child.kill().await.expect("kill");
}

#[tokio::test]
async fn bad_arguments_are_refused_naming_the_flag() {
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-sim"))
        .args([
            "--nodes",
            "0",
            "--base",
            &SIM_BINARY.ip(1, 1).to_string(),
            "--talos-version",
            "v1.14.1",
        ])
        .output()
        .await
        .expect("run");
    assert_eq!(output.status.code(), Some(2));
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--nodes takes a number"), "{stderr}");
    let output = Command::new(env!("CARGO_BIN_EXE_ichor-sim"))
        .args([
            "--nodes",
            "1",
            "--base",
            &SIM_BINARY.ip(1, 1).to_string(),
            "--talos-version",
            "v1.12.0",
        ])
        .output()
        .await
        .expect("run");
    assert!(String::from_utf8_lossy(&output.stderr).contains("v1.13.x and v1.14.x"));
}
