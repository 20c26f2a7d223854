//! Etcd snapshots of simulated control planes, read with etcd's own code
//! (`tools/talos-conformance snapshot-status`: bbolt's consistency check, etcdutl's snapshot
//! status and restore): the file talosctl saves, with the key count the simulator reports
//! (talos-facts §12); and `EtcdRecover`, which keeps an upload for a recovering Bootstrap.

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, NodeSpec, SimNode};
use ichor_talos::{ResetOptions, TalosClient};
use ichor_testenv::wait::eventually;
use support::{NodeConfig, WAIT, admin, bundle_for, credentials, node_config};

/// A bootstrapped control plane on 127.0.94.`host` whose cluster holds about `etcd_size`
/// bytes.
async fn control_plane(host: u8, etcd_size: u64) -> (SimNode, TalosClient) {
    let b = bundle_for(94);
    let addr = SocketAddr::from(([127, 0, 94, host], 50000));
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
        hardware: Hardware::vm(94 * 256 + u32::from(host)),
        config: Some(config),
        etcd_size,
        ..NodeSpec::new(addr, "v1.14.1")
    })
    .await
    .expect("start");
    let client = admin(&b, node.addr()).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    (node, client)
}

/// `talos-conformance snapshot-status` of a snapshot, as `key value` pairs.
fn status(snapshot: &[u8]) -> BTreeMap<String, String> {
    let binary = ichor_testenv::assets::oracles_dir().join("talos-conformance");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build it",
        binary.display()
    );
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("snapshot.db");
    std::fs::write(&path, snapshot).expect("write the snapshot");
    let output = Command::new(&binary)
        .arg("snapshot-status")
        .arg(&path)
        .output()
        .expect("run talos-conformance");
    assert!(
        output.status.success(),
        "snapshot-status refused the snapshot: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout)
        .expect("utf8")
        .lines()
        .filter_map(|l| l.split_once(' '))
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect()
}

fn number(status: &BTreeMap<String, String>, key: &str) -> u64 {
    status
        .get(key)
        .unwrap_or_else(|| panic!("no {key} in {status:?}"))
        .parse()
        .expect("a number")
}

#[tokio::test]
async fn a_snapshot_is_an_etcd_database_with_the_simulators_key_count() {
    let (node, client) = control_plane(1, 256 << 10).await;
    let snapshot = client.etcd_snapshot().await.expect("snapshot");
    assert_eq!(snapshot.len() % 512, 32, "talosctl's trailer check");
    let status = status(&snapshot);
    for fact in ["sha256", "bbolt-check", "restore"] {
        assert_eq!(status.get(fact).map(String::as_str), Some("ok"), "{fact}");
    }
    assert_eq!(
        number(&status, "total-keys"),
        node.etcd_keys().await.expect("a member") as u64,
        "talosctl prints the simulator's key count"
    );
    assert_eq!(number(&status, "total-size"), snapshot.len() as u64 - 32);
    assert_eq!(
        status["buckets"],
        "alarm,auth,authRoles,authUsers,cluster,key,lease,members,members_removed,meta"
    );
    assert_eq!(status["version"], "3.6.0", "etcd 3.6's storage version");
    assert_eq!(status["members"], "1");
    let etcd = client.etcd_status().await.expect("status");
    assert_eq!(
        etcd.db_size as u64,
        number(&status, "total-size"),
        "etcd status reports the database the snapshot holds"
    );
    assert!(number(&status, "consistent-index") > 0);
    assert!(number(&status, "key-tombstones") > 0, "deleted events");

    let again = client.etcd_snapshot().await.expect("snapshot");
    assert_eq!(
        status["hash"],
        self::status(&again)["hash"],
        "the same cluster's keyspace every time"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_large_snapshot_spans_several_branch_levels() {
    let (node, client) = control_plane(2, 48 << 20).await;
    let snapshot = client.etcd_snapshot().await.expect("snapshot");
    let status = status(&snapshot);
    assert_eq!(status["bbolt-check"], "ok");
    assert_eq!(status["restore"], "ok");
    assert!(
        number(&status, "key-depth") >= 3,
        "leaves under two branch levels: {status:?}"
    );
    assert!(number(&status, "key-overflow-pages") > 0, "large objects");
    let size = number(&status, "total-size");
    assert!(
        size.abs_diff(48 << 20) < (48 << 20) / 10,
        "about the configured size: {size}"
    );
    assert_eq!(
        number(&status, "total-keys"),
        node.etcd_keys().await.expect("a member") as u64
    );
    node.stop().await;
}

#[tokio::test]
async fn snapshots_are_for_operators_and_etcd_backup_not_readers() {
    let (node, _) = control_plane(3, 256 << 10).await;
    let b = bundle_for(94);
    let connect = |role| {
        let credentials = credentials(&b, role);
        let endpoint = node.addr().to_string();
        async move {
            TalosClient::connect(&endpoint, &credentials)
                .await
                .expect("connect")
        }
    };
    let operator = connect(TalosRole::Operator).await;
    assert!(operator.etcd_snapshot().await.is_ok(), "os:operator may");
    let reader = connect(TalosRole::Reader).await;
    let refused = reader.etcd_snapshot().await.expect_err("os:reader may not");
    assert_eq!(refused.code(), Some(tonic::Code::PermissionDenied));
    node.stop().await;
}

#[tokio::test]
async fn an_uploaded_snapshot_is_kept_with_what_a_recovery_will_find() {
    let (node, client) = control_plane(4, 256 << 10).await;
    assert_eq!(node.etcd_recovery_snapshot().await, None);
    let snapshot = client.etcd_snapshot().await.expect("snapshot");
    client.etcd_recover(&snapshot).await.expect("upload");
    let kept = node.etcd_recovery_snapshot().await.expect("kept");
    assert_eq!(kept.size, snapshot.len() as u64);
    assert_eq!(kept.restorable, Ok(()));

    // Talos writes whatever arrives; the recovery is what refuses it.
    let mut corrupt = snapshot.clone();
    corrupt[5000] ^= 0xff;
    client.etcd_recover(&corrupt).await.expect("upload");
    let kept = node.etcd_recovery_snapshot().await.expect("kept");
    assert!(kept.restorable.is_err(), "the trailer no longer matches");
    assert_eq!(kept.restorable_skipping_hash, Ok(()));
    client
        .etcd_recover(b"ichor-sim etcd snapshot\n")
        .await
        .expect("upload");
    let kept = node.etcd_recovery_snapshot().await.expect("kept");
    assert!(kept.restorable_skipping_hash.is_err(), "not a bbolt file");

    let reader = TalosClient::connect(
        &node.addr().to_string(),
        &credentials(&bundle_for(94), TalosRole::Operator),
    )
    .await
    .expect("connect");
    let refused = reader
        .etcd_recover(&snapshot)
        .await
        .expect_err("admin only");
    assert_eq!(refused.code(), Some(tonic::Code::PermissionDenied));

    // It lives in EPHEMERAL: a reset that wipes EPHEMERAL takes it.
    client
        .reset(ResetOptions {
            graceful: false,
            reboot: true,
        })
        .await
        .expect("reset");
    eventually("the upload wiped", WAIT, || async {
        node.etcd_recovery_snapshot().await.is_none()
    })
    .await;
    node.stop().await;
}

#[tokio::test]
async fn a_streamed_snapshot_passes_through_a_channel_checked_and_whole() {
    let (node, client) = control_plane(5, 2 << 20).await;
    // A small channel: the stream waits for the reader, nothing is held whole.
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let reader = tokio::spawn(async move {
        let mut all = Vec::new();
        let mut chunks = 0;
        while let Some(chunk) = rx.recv().await {
            chunks += 1;
            all.extend_from_slice(&chunk);
        }
        (all, chunks)
    });
    let summary = client.etcd_snapshot_to(tx, |_| {}).await.expect("streamed");
    let (bytes, chunks) = reader.await.expect("reader");
    assert_eq!(summary.size, bytes.len() as u64);
    assert!(chunks > 1, "in chunks");
    let status = status(&bytes);
    assert_eq!(status["bbolt-check"], "ok");
    assert_eq!(status["restore"], "ok", "etcd restores what was streamed");

    // A reader that goes away stops the stream with an error.
    let (tx, rx) = tokio::sync::mpsc::channel::<Vec<u8>>(1);
    drop(rx);
    let error = client
        .etcd_snapshot_to(tx, |_| {})
        .await
        .expect_err("nobody reads");
    assert!(error.to_string().contains("stopped reading"), "{error}");
    node.stop().await;
}
