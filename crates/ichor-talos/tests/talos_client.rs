//! Talos's own Go client (`tools/talos-conformance drive`) against the simulator: discovery over
//! the pinned maintenance connection, apply, then mutual TLS with the talosconfig Talos generates
//! from the same bundle — so the simulator answers what the real client expects, not only what
//! Ichor's client reads. Also: `talos-conformance fingerprint` (Talos's own code) agrees with
//! ichor-talos's fingerprint, and a wrong pin fails the run.

use std::collections::BTreeMap;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Output, Stdio};

use ichor_sim::{Hardware, SimNode};
use ichor_testenv::nets::TALOS_CLIENT;

/// The tool built by `cargo xtask oracles`.
fn tool() -> PathBuf {
    let binary = ichor_testenv::assets::oracles_dir().join("talos-conformance");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build it",
        binary.display()
    );
    binary
}

/// A file of ichor-render's golden fixtures.
fn golden(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../ichor-render/tests/golden")
        .join(name)
}

/// Boots a 1.14.1 node in maintenance mode on `addr` (Talos's client dials port 50000). Its
/// disk is `sda`, the disk the golden configs install to: Talos leaves an install to a disk the
/// machine does not have pending (talos-facts §11.7).
async fn node(addr: &str, seed: u32) -> SimNode {
    let addr: SocketAddr = addr.parse().expect("addr");
    let mut hardware = Hardware::vm(seed);
    for disk in hardware.disks.iter_mut().filter(|d| !d.cdrom) {
        disk.name = "sda".into();
    }
    SimNode::start_with(addr, "v1.14.1", hardware)
        .await
        .expect("start a simulated node")
}

/// Runs `drive` against `node`, pinning `fingerprint`.
async fn drive(node: &SimNode, fingerprint: &str) -> Output {
    tokio::process::Command::new(tool())
        .arg("drive")
        .arg("--endpoint")
        .arg(node.addr().to_string())
        .arg("--fingerprint")
        .arg(fingerprint)
        .arg("--config")
        .arg(golden("1.14-controlplane-none-plain.yaml"))
        .arg("--bundle")
        .arg(golden("bundle-1.14.yaml"))
        .kill_on_drop(true)
        .output()
        .await
        .expect("run talos-conformance drive")
}

/// The `key value` lines of a run, every value of a key in order.
fn facts(output: &Output) -> BTreeMap<String, Vec<String>> {
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for line in String::from_utf8_lossy(&output.stdout).lines() {
        let (key, value) = line.split_once(' ').unwrap_or((line, ""));
        out.entry(key.to_owned())
            .or_default()
            .push(value.to_owned());
    }
    out
}

/// `talos-conformance fingerprint` of a PEM certificate.
fn talos_fingerprint(cert_pem: &str) -> String {
    let mut child = std::process::Command::new(tool())
        .arg("fingerprint")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("run talos-conformance fingerprint");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(cert_pem.as_bytes())
        .expect("write the certificate");
    let output = child.wait_with_output().expect("wait for fingerprint");
    assert!(
        output.status.success(),
        "fingerprint failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf8")
        .trim()
        .to_owned()
}

/// ichor-render's golden test bundle (contract 1.14).
fn test_bundle() -> ichor_render::SecretsBundle {
    ichor_render::SecretsBundle::from_yaml(
        &std::fs::read_to_string(golden("bundle-1.14.yaml")).expect("read the bundle"),
    )
    .expect("the test bundle")
}

/// The OS CA certificate of the test bundle, as PEM.
fn os_ca_pem() -> String {
    test_bundle().certs.os.crt.0.clone()
}

#[tokio::test]
async fn talos_client_discovers_applies_and_reaches_the_node_over_mutual_tls() {
    let node = node(&format!("{}:50000", TALOS_CLIENT.ip(0, 1)), 7).await;
    let output = drive(&node, &node.fingerprint()).await;
    let sda = node
        .hardware()
        .disks
        .iter()
        .find(|d| d.name == "sda")
        .expect("the machine has sda");
    // Maintenance first (never ready there), then the configured node behind mutual TLS.
    let expected = [
        ("version", "v1.14.1".to_owned()),
        ("disk", format!("sda {}", sda.size)),
        ("uuid", node.hardware().uuid.clone()),
        ("stage", "maintenance".to_owned()),
        ("ready", "false".to_owned()),
        ("applied-mode", "NO_REBOOT".to_owned()),
        ("mtls-version", "v1.14.1".to_owned()),
        ("mtls-stage", "running".to_owned()),
    ];
    let facts = facts(&output);
    let missing: Vec<String> = expected
        .iter()
        .filter(|(key, value)| !facts.get(*key).is_some_and(|values| values.contains(value)))
        .map(|(key, value)| format!("{key} {value}"))
        .collect();
    assert!(
        missing.is_empty() && output.status.success(),
        "missing facts {missing:?}; printed {facts:?}; stderr:\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    node.stop().await;
}

/// Talos's own fingerprint code agrees with ours on every kind of certificate a pin can meet:
/// a node serving certificate and the OS CA (Ed25519), the etcd CA (ECDSA P-256).
#[test]
fn talos_fingerprint_matches_ichor_talos_fingerprint() {
    let bundle = test_bundle();
    let node = ichor_render::pki::node_server_certificate(
        &bundle,
        "cp-1",
        &["192.168.10.21".parse().expect("ip")],
        std::time::Duration::from_secs(3600),
    )
    .expect("node certificate");
    for cert in [
        &node.cert_pem,
        &bundle.certs.os.crt.0,
        &bundle.certs.etcd.crt.0,
    ] {
        let ours = ichor_talos::fingerprint_pem(cert).expect("our fingerprint");
        assert_eq!(talos_fingerprint(cert), ours, "{cert}");
    }
}

#[tokio::test]
async fn talos_client_refuses_a_node_whose_certificate_does_not_match_the_pin() {
    let node = node(&format!("{}:50000", TALOS_CLIENT.ip(0, 2)), 8).await;
    // A well-formed fingerprint, of another certificate.
    let wrong = talos_fingerprint(&os_ca_pem());
    assert_ne!(wrong, node.fingerprint());
    let output = drive(&node, &wrong).await;
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        !output.status.success(),
        "drive must fail on a pin mismatch; stdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        facts(&output).is_empty(),
        "nothing is read from a node that fails the pin: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert!(
        stderr.contains("doesn't match the provided fingerprints"),
        "the failure names the pin: {stderr}"
    );
    node.stop().await;
}
