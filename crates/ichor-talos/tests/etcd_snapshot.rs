//! Etcd snapshots of simulated control planes, read with etcd's own code
//! (`tools/talos-conformance snapshot-status`: bbolt's consistency check, etcdutl's snapshot
//! status and restore): the file talosctl saves, with the key count the simulator reports
//! (talos-facts §12); `EtcdRecover`, which keeps an upload for a recovering Bootstrap; and
//! that Bootstrap, which restores the upload as Talos does or fails the etcd service as Talos's
//! fails (`crates/ichor-sim/docs/etcd-recovery.md`).

mod support;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, NodeSpec, SimNode};
use ichor_talos::{Bootstrapped, ResetOptions, TalosClient};
use ichor_testenv::nets::TALOS_ETCD_SNAPSHOT;
use ichor_testenv::wait::eventually;
use support::{NodeConfig, WAIT, admin, bundle_for, credentials, node_config};

/// The cluster identity of the control plane on 127.0.94.`host` that [`control_plane`]
/// starts: one of its own. The tests of this file run at once in one process, on one simulated
/// network, where a control plane joins any bootstrapped cluster of its identity it discovers:
/// two tests sharing an identity would each find the other's member in their snapshot once the
/// second node started later than the discovery delay (as on a busy machine).
const fn identity_of(host: u8) -> u8 {
    200 + host
}

/// A bootstrapped control plane on 127.0.94.`host`, alone in its identity
/// ([`identity_of`]), whose cluster holds about `etcd_size` bytes.
async fn control_plane(host: u8, etcd_size: u64) -> (SimNode, TalosClient) {
    control_plane_of(identity_of(host), host, etcd_size).await
}

/// A bootstrapped control plane on 127.0.94.`host` of the cluster identity `cluster`.
async fn control_plane_of(cluster: u8, host: u8, etcd_size: u64) -> (SimNode, TalosClient) {
    let (node, client) = fresh_control_plane(cluster, host, etcd_size).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    (node, client)
}

/// A control plane on 127.0.94.`host` of the cluster identity `cluster`, not bootstrapped:
/// alone in its identity, it has no cluster to join.
async fn fresh_control_plane(cluster: u8, host: u8, etcd_size: u64) -> (SimNode, TalosClient) {
    let b = bundle_for(cluster);
    let addr = SocketAddr::from((TALOS_ETCD_SNAPSHOT.ip(0, host), 50000));
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
    let b = bundle_for(identity_of(3));
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
        &credentials(&bundle_for(identity_of(4)), TalosRole::Operator),
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

/// The etcd service as the node lists it, once its state is `state`.
/// A recovering Bootstrap (`skip`: without the hash check), and its answer.
async fn recover(client: &TalosClient, skip: bool) -> Bootstrapped {
    client
        .bootstrap_recover(Duration::from_secs(5), skip)
        .await
        .expect("bootstrap")
}

/// Asserts what `node`'s member reads at `key`.
async fn reads(node: &SimNode, key: &str, value: Option<&[u8]>) {
    assert_eq!(
        node.etcd_get(key).await.expect("get").as_deref(),
        value,
        "{key}"
    );
}

/// How many members the node's etcd lists, all voters.
async fn voters(client: &TalosClient) -> usize {
    let members = client.etcd_members(false).await.expect("members");
    assert!(members.iter().all(|m| !m.learner), "{members:?}");
    members.len()
}

async fn etcd_service(client: &TalosClient, state: &str) -> ichor_talos::Service {
    eventually(&format!("etcd {state}"), WAIT, || async {
        client
            .services()
            .await
            .expect("services")
            .into_iter()
            .find(|s| s.id == "etcd" && s.state == state)
    })
    .await
}

/// A snapshot of `client`'s node streamed straight into `target`'s upload, and the bytes
/// that went through (kept to check them with etcd's code).
async fn snapshot_into(client: &TalosClient, target: &TalosClient) -> Vec<u8> {
    let (tx, mut rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let (up_tx, up_rx) = tokio::sync::mpsc::channel::<Vec<u8>>(4);
    let tee = tokio::spawn(async move {
        let mut all = Vec::new();
        while let Some(chunk) = rx.recv().await {
            all.extend_from_slice(&chunk);
            up_tx.send(chunk).await.expect("the upload reads");
        }
        all
    });
    let (taken, uploaded) = tokio::join!(
        client.etcd_snapshot_to(tx, |_| {}),
        target.etcd_recover_from(up_rx)
    );
    let summary = taken.expect("snapshot");
    uploaded.expect("upload");
    let bytes = tee.await.expect("tee");
    assert_eq!(summary.size, bytes.len() as u64);
    bytes
}

#[tokio::test]
async fn a_snapshot_restores_on_another_clusters_control_plane_with_the_keys_written_before() {
    let (source, client) = control_plane_of(95, 6, 256 << 10).await;
    source.etcd_put("/ichor/test/a", "one").await.expect("put");
    source.etcd_put("/ichor/test/b", "two").await.expect("put");
    source.etcd_put("/ichor/test/gone", "x").await.expect("put");
    assert!(
        source
            .etcd_delete("/ichor/test/gone")
            .await
            .expect("delete")
    );
    let keys = source.etcd_keys().await.expect("a member");

    let (target, recovering) = fresh_control_plane(96, 7, 256 << 10).await;
    let snapshot = snapshot_into(&client, &recovering).await;
    let status = status(&snapshot);
    assert_eq!(
        status["restore"], "ok",
        "etcd restores the snapshot with the keys"
    );
    assert_eq!(number(&status, "total-keys"), keys as u64);
    assert_eq!(
        target.etcd_recovery_snapshot().await.map(|s| s.size),
        Some(snapshot.len() as u64),
        "the upload is kept, whole"
    );

    assert_eq!(recover(&recovering, false).await, Bootstrapped::Now);
    reads(&target, "/ichor/test/a", Some(b"one")).await;
    reads(&target, "/ichor/test/b", Some(b"two")).await;
    reads(&target, "/ichor/test/gone", None).await;
    assert_eq!(
        target.etcd_keys().await,
        Some(keys),
        "the whole keyspace came back"
    );
    let members = recovering.etcd_members(false).await.expect("members");
    assert_eq!(members.len(), 1, "{members:?}");
    assert_eq!(members[0].hostname, "cp-7");
    assert!(!members[0].learner, "a voter");
    assert_ne!(
        Some(members[0].id),
        source.etcd_member_id().await,
        "a new member of a new cluster"
    );
    etcd_service(&recovering, "Running").await;
    assert_eq!(
        target.etcd_recovery_snapshot().await,
        None,
        "the upload is deleted once restored"
    );
    assert_eq!(
        recovering
            .bootstrap(Duration::from_secs(5))
            .await
            .expect("bootstrap"),
        Bootstrapped::Already,
        "a second Bootstrap is refused: AlreadyExists"
    );
    assert_eq!(recover(&recovering, false).await, Bootstrapped::Already);

    // The restored cluster goes on from the snapshot's revision; its own snapshot holds both.
    target
        .etcd_put("/ichor/test/c", "three")
        .await
        .expect("put");
    assert_eq!(
        source.etcd_get("/ichor/test/c").await.expect("get"),
        None,
        "apart"
    );
    let again = recovering.etcd_snapshot().await.expect("snapshot");
    let status = self::status(&again);
    assert_eq!(status["restore"], "ok");
    assert_eq!(number(&status, "total-keys"), keys as u64 + 1);
    assert_eq!(status["members"], "1");
    source.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn a_recovering_bootstrap_without_an_upload_fails_the_etcd_service_and_may_be_retried() {
    let (target, recovering) = fresh_control_plane(97, 8, 256 << 10).await;
    // Talos answers the call, then the etcd service fails in its pre-start step.
    assert_eq!(recover(&recovering, false).await, Bootstrapped::Now);
    let etcd = etcd_service(&recovering, "Failed").await;
    assert_eq!(
        etcd.message,
        "Failed to run pre stage: error verifying snapshot: stat /var/lib/etcd.snapshot: no such file or directory"
    );
    let refused = recovering.etcd_members(false).await.expect_err("no member");
    assert_eq!(refused.code(), Some(tonic::Code::Unavailable));
    assert_eq!(target.etcd_member_id().await, None);

    // The data directory stayed empty: upload, and bootstrap again.
    let (source, client) = control_plane_of(98, 9, 256 << 10).await;
    source
        .etcd_put("/ichor/test/late", "yes")
        .await
        .expect("put");
    snapshot_into(&client, &recovering).await;
    assert_eq!(recover(&recovering, false).await, Bootstrapped::Now);
    etcd_service(&recovering, "Running").await;
    reads(&target, "/ichor/test/late", Some(b"yes")).await;
    assert_eq!(voters(&recovering).await, 1);
    source.stop().await;
    target.stop().await;
}

#[tokio::test]
async fn a_corrupted_upload_fails_the_hash_check_and_is_restored_as_it_is_when_skipped() {
    let (source, client) = control_plane_of(99, 10, 256 << 10).await;
    source
        .etcd_put("/ichor/test/value", "precious")
        .await
        .expect("put");
    let mut corrupt = client.etcd_snapshot().await.expect("snapshot");
    let at = corrupt
        .windows(8)
        .position(|w| w == b"precious")
        .expect("the value is in the key bucket as it was written");
    corrupt[at] ^= 0x20;

    // Checked: the hash does not match, after etcdutl copied the database into the data
    // directory, which is no longer empty: no Bootstrap is possible any more.
    let (checked, checking) = fresh_control_plane(100, 11, 256 << 10).await;
    checking.etcd_recover(&corrupt).await.expect("upload");
    assert_eq!(recover(&checking, false).await, Bootstrapped::Now);
    let etcd = etcd_service(&checking, "Failed").await;
    assert!(
        etcd.message.starts_with(
            "Failed to run pre stage: error recovering from the snapshot: expected sha256 ["
        ),
        "{}",
        etcd.message
    );
    assert!(checking.etcd_members(false).await.is_err(), "no member");
    assert_eq!(
        recover(&checking, true).await,
        Bootstrapped::Already,
        "the data directory is not empty"
    );
    assert!(
        checked.etcd_recovery_snapshot().await.is_some(),
        "a failed recovery keeps the upload"
    );

    // Skipped: restored as it is, the flipped byte included.
    let (skipped, skipping) = fresh_control_plane(101, 12, 256 << 10).await;
    skipping.etcd_recover(&corrupt).await.expect("upload");
    assert_eq!(recover(&skipping, true).await, Bootstrapped::Now);
    etcd_service(&skipping, "Running").await;
    reads(&skipped, "/ichor/test/value", Some(b"Precious")).await;
    assert_eq!(voters(&skipping).await, 1);
    source.stop().await;
    checked.stop().await;
    skipped.stop().await;
}
