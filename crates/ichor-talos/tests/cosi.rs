//! The COSI state of simulated nodes as Talos serves it: checked with Talos's own Go client and
//! types (`tools/talos-conformance resources`: definitions, namespaces, both spec encodings of
//! every resource, Get/List/Watch agreement, the access policy), and watched as `talosctl get
//! -w` watches (talos-facts §13).

mod support;

use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::SecretsBundle;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, SimNode};
use ichor_talos::api::cosi::resource::state_client::StateClient;
use ichor_talos::api::cosi::resource::{
    EventType, GetRequest, ListRequest, WatchOptions, WatchRequest, WatchResponse,
};
use ichor_talos::api::resource::definitions::runtime::MachineStatusSpec;
use ichor_talos::{ApplyMode, TalosClient};
use ichor_testenv::nets::TALOS_COSI;
use ichor_testenv::wait::eventually;
use prost::Message as _;
use support::{WAIT, bundle_for, config, credentials};
use tokio::process::Command;
use tokio_stream::StreamExt as _;
use tonic::Code;

const MACHINE_STATUS: &str = "MachineStatuses.runtime.talos.dev";

/// Runs `talos-conformance resources` against a node; returns its stdout, failing the test
/// (with the tool's complaints) when the node's COSI state differs from Talos's.
async fn conformance(args: &[&str]) -> String {
    let binary = ichor_testenv::assets::oracles_dir().join("talos-conformance");
    assert!(
        binary.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build it",
        binary.display()
    );
    // Asynchronously: the simulated node answers on this test's runtime.
    let output = Command::new(&binary)
        .arg("resources")
        .args(args)
        .output()
        .await
        .expect("run talos-conformance");
    let stdout = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        output.status.success(),
        "the node's COSI state differs from Talos's:\n{}\n{stdout}",
        String::from_utf8_lossy(&output.stderr)
    );
    stdout
}

/// A talosconfig file for the bundle's OS CA with `role`, in a temporary folder removed when the
/// returned guard drops (its key leaves nothing behind).
fn talosconfig(
    bundle: &SecretsBundle,
    role: TalosRole,
    name: &str,
) -> (tempfile::TempDir, std::path::PathBuf) {
    use base64::Engine as _;
    let issued = credentials(bundle, role);
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let yaml = format!(
        "context: sim\ncontexts:\n  sim:\n    endpoints: []\n    ca: {}\n    crt: {}\n    key: {}\n",
        b64(&issued.ca_pem),
        b64(&issued.cert_pem),
        b64(&issued.key_pem)
    );
    let dir = tempfile::Builder::new()
        .prefix(&format!("ichor-cosi-{name}-"))
        .tempdir()
        .expect("temp dir");
    let path = dir.path().join("talosconfig");
    std::fs::write(&path, yaml).expect("write the talosconfig");
    (dir, path)
}

async fn maintenance_node() -> (SimNode, TalosClient) {
    let node = SimNode::start_with(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.14.1",
        Hardware::vm(91),
    )
    .await
    .expect("start a simulated node");
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect");
    (node, client)
}

/// A bootstrapped control plane of its own cluster identity, and an admin client.
async fn bootstrapped(cluster: u8) -> (SimNode, TalosClient, SecretsBundle) {
    let b = bundle_for(cluster);
    let node = SimNode::start_configured(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.14.1",
        Hardware::vm(u32::from(cluster)),
        &config(&b, Role::ControlPlane, "v1.14.1"),
    )
    .await
    .expect("start a configured node");
    let admin = support::admin(&b, node.addr()).await;
    admin
        .bootstrap(Duration::from_secs(10))
        .await
        .expect("bootstrap");
    let probe = admin.clone();
    eventually("the local etcd member resource", WAIT, || {
        let client = probe.clone();
        async move {
            StateClient::new(client.channel())
                .get(GetRequest {
                    namespace: "etcd".into(),
                    r#type: "EtcdMembers.etcd.talos.dev".into(),
                    id: "local".into(),
                    options: None,
                })
                .await
                .is_ok()
        }
    })
    .await;
    (node, admin, b)
}

#[tokio::test]
async fn talos_types_decode_everything_a_maintenance_node_serves() {
    let (node, _) = maintenance_node().await;
    let out = conformance(&["--endpoint", &node.addr().to_string(), "--insecure"]).await;
    for line in [
        "definition resourcedefinitions.meta.cosi.dev meta non-sensitive",
        "definition machineconfigs.config.talos.dev config sensitive",
        "resource Disks.block.talos.dev runtime/vda 1",
        "resource SystemInformations.hardware.talos.dev hardware/systeminformation 1",
        "resource LinkStatuses.net.talos.dev network/eth0 1",
        "resource MachineStatuses.runtime.talos.dev runtime/machine 1",
        "refused MachineConfigs.config.talos.dev not-authorized",
        "refused namespace not-supported",
    ] {
        assert!(out.lines().any(|l| l == line), "no `{line}` in:\n{out}");
    }
    node.stop().await;
}

#[tokio::test]
async fn a_1_13_node_registers_what_1_13_registers() {
    let node = SimNode::start_with(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.13.9",
        Hardware::vm(94),
    )
    .await
    .expect("start");
    let out = conformance(&["--endpoint", &node.addr().to_string(), "--insecure"]).await;
    assert!(
        !out.contains("unattendedinstallstatuses"),
        "the unattended install came with 1.14:\n{out}"
    );
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect");
    let status = StateClient::new(client.channel())
        .get(GetRequest {
            namespace: "runtime".into(),
            r#type: "UnattendedInstallStatuses.runtime.talos.dev".into(),
            id: "unattended-install".into(),
            options: None,
        })
        .await
        .expect_err("not registered");
    assert_eq!(
        status.message(),
        "resource type \"UnattendedInstallStatuses.runtime.talos.dev\" is not supported"
    );
    node.stop().await;
}

#[tokio::test]
async fn talos_types_decode_everything_a_configured_node_serves() {
    let (node, admin_client, b) = bootstrapped(191).await;
    // The static pods run once etcd does (talos-facts §14.2).
    eventually("the control-plane static pods ready", WAIT, || async {
        admin_client
            .static_pod_statuses()
            .await
            .is_ok_and(|s| s.len() == 3 && s.iter().all(|p| p.ready))
    })
    .await;
    let endpoint = node.addr().to_string();
    let (_admin_dir, admin) = talosconfig(&b, TalosRole::Admin, "admin");
    let out = conformance(&[
        "--endpoint",
        &endpoint,
        "--talosconfig",
        admin.to_str().expect("path"),
        "--admin",
    ])
    .await;
    for line in [
        "resource MachineConfigs.config.talos.dev config/v1alpha1 1",
        "resource EtcdMembers.etcd.talos.dev etcd/local 1",
        "resource Nodenames.kubernetes.talos.dev k8s/nodename 1",
        "resource VolumeStatuses.block.talos.dev runtime/EPHEMERAL 1",
        "resource SystemDisks.block.talos.dev runtime/system-disk 1",
    ] {
        assert!(out.lines().any(|l| l == line), "no `{line}` in:\n{out}");
    }
    assert!(
        out.lines()
            .any(|l| l.starts_with("resource Members.cluster.talos.dev cluster/")),
        "the node is a member of its own cluster:\n{out}"
    );
    for prefix in [
        "resource StaticPodStatuses.kubernetes.talos.dev k8s/kube-system/kube-apiserver-",
        "resource StaticPodStatuses.kubernetes.talos.dev k8s/kube-system/kube-controller-manager-",
        "resource StaticPodStatuses.kubernetes.talos.dev k8s/kube-system/kube-scheduler-",
        "resource Manifests.kubernetes.talos.dev controlplane/10-kube-proxy ",
        "resource Manifests.kubernetes.talos.dev controlplane/11-core-dns ",
        "resource Manifests.kubernetes.talos.dev controlplane/11-core-dns-svc ",
    ] {
        assert!(
            out.lines().any(|l| l.starts_with(prefix)),
            "no `{prefix}…` in:\n{out}"
        );
    }
    // os:reader reads all but the sensitive types.
    let (_reader_dir, reader) = talosconfig(&b, TalosRole::Reader, "reader");
    let out = conformance(&[
        "--endpoint",
        &endpoint,
        "--talosconfig",
        reader.to_str().expect("path"),
    ])
    .await;
    assert!(
        out.lines()
            .any(|l| l == "refused MachineConfigs.config.talos.dev not-authorized"),
        "{out}"
    );
    node.stop().await;
}

/// Reads the next watch message, failing after a while.
async fn next(stream: &mut tonic::Streaming<WatchResponse>) -> Option<WatchResponse> {
    tokio::time::timeout(Duration::from_secs(10), stream.next())
        .await
        .expect("a watch message in time")
        .and_then(Result::ok)
}

fn stage_of(response: &WatchResponse) -> (i32, i32, String) {
    let event = &response.event[0];
    let resource = event.resource.clone().unwrap_or_default();
    let spec = MachineStatusSpec::decode(resource.spec.unwrap_or_default().proto_spec.as_slice())
        .expect("machine status spec");
    (
        event.event_type,
        spec.stage,
        resource.metadata.unwrap_or_default().version,
    )
}

#[tokio::test]
async fn a_machine_status_watch_follows_the_install() {
    let (node, client) = maintenance_node().await;
    let mut stream = StateClient::new(client.channel())
        .watch(WatchRequest {
            namespace: "runtime".into(),
            r#type: MACHINE_STATUS.into(),
            id: None,
            options: Some(WatchOptions {
                bootstrap_contents: true,
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .expect("watch")
        .into_inner();
    let ready = next(&mut stream).await.expect("the ready marker");
    assert!(ready.event.is_empty(), "the first message has no events");
    let created = next(&mut stream).await.expect("the bootstrap contents");
    assert_eq!(
        stage_of(&created),
        (EventType::Created as i32, 3, "1".into()),
        "created, maintenance, version 1"
    );
    let marker = next(&mut stream).await.expect("the bootstrapped marker");
    assert_eq!(marker.event[0].event_type, EventType::Bootstrapped as i32);
    assert!(marker.event[0].bookmark.is_some());

    let b = bundle_for(192);
    client
        .apply_configuration(
            config(&b, Role::ControlPlane, "v1.14.1").as_bytes(),
            ApplyMode::NoReboot,
        )
        .await
        .expect("apply");
    // The config is complete: the maintenance service goes, and the watch on it ends
    // (`controllers/config/acquire.go`; crates/ichor-sim/docs/install-failures.md).
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(
        ended.is_ok(),
        "the maintenance watch ends once the config is in"
    );

    // The configured API serves while the unattended installer runs: a watch there starts at
    // stage booting (1.14 has no install sequence; the boot waits for phase installed), sees
    // the reboot the install asks for, then ends with the boot.
    let admin = support::admin(&b, node.addr()).await;
    let mut stream = StateClient::new(admin.channel())
        .watch(WatchRequest {
            namespace: "runtime".into(),
            r#type: MACHINE_STATUS.into(),
            id: None,
            options: Some(WatchOptions {
                bootstrap_contents: true,
                ..Default::default()
            }),
            api_version: 1,
        })
        .await
        .expect("watch over mutual TLS")
        .into_inner();
    assert!(next(&mut stream).await.expect("ready").event.is_empty());
    let installing = next(&mut stream).await.expect("the bootstrap contents");
    let (kind, stage, _) = stage_of(&installing);
    assert_eq!((kind, stage), (EventType::Created as i32, 1), "booting");
    let _bootstrapped = next(&mut stream).await.expect("the bootstrapped marker");
    let rebooting = next(&mut stream).await.expect("the reboot");
    let (kind, stage, _) = stage_of(&rebooting);
    assert_eq!((kind, stage), (EventType::Updated as i32, 5), "rebooting");
    assert!(
        rebooting.event[0].old.is_some(),
        "an update carries the old resource"
    );
    let ended = tokio::time::timeout(Duration::from_secs(10), async {
        while let Some(Ok(_)) = stream.next().await {}
    })
    .await;
    assert!(ended.is_ok(), "the watch ends when the node reboots");
    node.stop().await;
}

#[tokio::test]
async fn a_watch_of_a_missing_resource_starts_with_its_tombstone() {
    let (node, client) = maintenance_node().await;
    let mut stream = StateClient::new(client.channel())
        .watch(WatchRequest {
            namespace: "runtime".into(),
            r#type: "Disks.block.talos.dev".into(),
            id: Some("sdz".into()),
            options: None,
            api_version: 1,
        })
        .await
        .expect("watch")
        .into_inner();
    assert!(next(&mut stream).await.expect("ready").event.is_empty());
    let first = next(&mut stream).await.expect("the initial event");
    let event = &first.event[0];
    assert_eq!(event.event_type, EventType::Destroyed as i32);
    let metadata = event
        .resource
        .clone()
        .and_then(|r| r.metadata)
        .expect("metadata");
    assert_eq!(
        (metadata.id.as_str(), metadata.version.as_str()),
        ("sdz", "undefined")
    );
    node.stop().await;
}

#[tokio::test]
async fn the_access_policy_answers_as_talos_does() {
    let (node, client) = maintenance_node().await;
    let mut state = StateClient::new(client.channel());
    let get = |namespace: &str, type_: &str, id: &str| GetRequest {
        namespace: namespace.into(),
        r#type: type_.into(),
        id: id.into(),
        options: None,
    };
    let refused = |r: Result<tonic::Response<_>, tonic::Status>| {
        let status = r.expect_err("refused");
        (status.code(), status.message().to_owned())
    };
    assert_eq!(
        refused(state.get(get("runtime", "Routes.net.talos.dev", "x")).await),
        (
            Code::PermissionDenied,
            "resource type \"Routes.net.talos.dev\" is not supported".to_owned()
        )
    );
    assert_eq!(
        refused(
            state
                .get(get("nowhere", "Disks.block.talos.dev", "vda"))
                .await
        ),
        (
            Code::PermissionDenied,
            "namespace \"nowhere\" is not supported".to_owned()
        )
    );
    assert_eq!(
        refused(
            state
                .get(get("config", "MachineConfigs.config.talos.dev", "v1alpha1"))
                .await
        ),
        (Code::PermissionDenied, "not authorized".to_owned()),
        "maintenance mode grants os:reader only"
    );
    assert_eq!(
        refused(
            state
                .get(get("runtime", "Disks.block.talos.dev", "sdz"))
                .await
        ),
        (
            Code::NotFound,
            "resource Disks.block.talos.dev(runtime/sdz@undefined) doesn't exist".to_owned()
        )
    );
    // The policy looks a type up lowercased, the state as given.
    assert_eq!(
        refused(
            state
                .get(get("runtime", "disks.block.talos.dev", "vda"))
                .await
        )
        .0,
        Code::NotFound
    );
    let listed: Vec<String> = state
        .list(ListRequest {
            namespace: "network".into(),
            r#type: "LinkStatuses.net.talos.dev".into(),
            options: None,
        })
        .await
        .expect("list")
        .into_inner()
        .filter_map(|r| r.ok()?.resource?.metadata.map(|m| m.id))
        .collect()
        .await;
    assert_eq!(listed, ["eth0", "lo"], "sorted by id");
    node.stop().await;
}

#[tokio::test]
async fn only_os_admin_reads_a_sensitive_type() {
    let (node, _admin, b) = bootstrapped(193).await;
    let endpoint = node.addr().to_string();
    let get = GetRequest {
        namespace: "config".into(),
        r#type: "MachineConfigs.config.talos.dev".into(),
        id: "v1alpha1".into(),
        options: None,
    };
    for (role, allowed) in [
        (TalosRole::Admin, true),
        (TalosRole::Operator, false),
        (TalosRole::Reader, false),
    ] {
        let client = TalosClient::connect(&endpoint, &credentials(&b, role))
            .await
            .expect("connect");
        let result = StateClient::new(client.channel()).get(get.clone()).await;
        match result {
            Ok(found) if allowed => {
                let spec = found
                    .into_inner()
                    .resource
                    .and_then(|r| r.spec)
                    .expect("spec");
                let config = ichor_talos::api::resource::config::MachineConfigSpec::decode(
                    spec.proto_spec.as_slice(),
                )
                .expect("machine config spec");
                assert!(
                    String::from_utf8_lossy(&config.yaml_marshalled).contains("controlplane"),
                    "the config as applied"
                );
            }
            Err(status) if !allowed => {
                assert_eq!(
                    (status.code(), status.message()),
                    (Code::PermissionDenied, "not authorized"),
                    "{role:?}"
                );
            }
            other => panic!("{role:?}: {other:?}"),
        }
    }
    node.stop().await;
}

/// Talos's types decode the user volumes a configured node serves, in every state it models
/// (a ready partition with trim and scrub on 1.14, a failed one, a whole disk, a directory),
/// and their disks' discovered partitions; on 1.13 and 1.14.
#[tokio::test]
async fn talos_types_decode_user_volumes() {
    for (host, version) in [(1u8, "v1.13.9"), (2u8, "v1.14.1")] {
        let b = bundle_for(170 + host);
        let mut hardware = Hardware::vm(u32::from(170 + host));
        for (name, size) in [("vdb", 50_000_000_000), ("vdc", 20_000_000_000)] {
            hardware.disks.push(ichor_sim::SimDisk {
                name: name.into(),
                size,
                cdrom: false,
                transport: "virtio".into(),
                model: String::new(),
                serial: format!("SIM{name}"),
            });
        }
        let per_volume = if version == "v1.14.1" {
            "scrub: {}\ntrim:\n  interval: 12h\n"
        } else {
            ""
        };
        let documents = [
            format!(
                "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == '/dev/vdb'\n  minSize: 1GiB\n  maxSize: 10GiB\nfilesystem:\n  type: xfs\n  projectQuotaSupport: true\n{per_volume}"
            ),
            "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: nowhere\nprovisioning:\n  diskSelector:\n    match: disk.size > 10u * TB\n  minSize: 1GiB\n".to_owned(),
            "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: whole\nvolumeType: disk\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == '/dev/vdc'\nfilesystem:\n  type: ext4\n".to_owned(),
            "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: shared\nvolumeType: directory\n".to_owned(),
        ];
        let mut text = config(&b, Role::ControlPlane, version);
        for d in &documents {
            text = format!("{}\n---\n{d}", text.trim_end());
        }
        let node =
            SimNode::start_configured((TALOS_COSI.ip(0, host), 0).into(), version, hardware, &text)
                .await
                .expect("start a configured node");
        let admin = support::admin(&b, node.addr()).await;
        let probe = admin.clone();
        eventually("the user volumes", WAIT, || {
            let client = probe.clone();
            async move {
                client
                    .user_volumes()
                    .await
                    .is_ok_and(|v| v.len() == 4 && v.iter().all(|v| v.phase != "waiting"))
            }
        })
        .await;
        let phases: Vec<(String, String)> = admin
            .user_volumes()
            .await
            .expect("user volumes")
            .into_iter()
            .map(|v| (v.name, v.phase))
            .collect();
        assert_eq!(
            phases,
            [
                ("data", "ready"),
                ("nowhere", "failed"),
                ("shared", "ready"),
                ("whole", "ready")
            ]
            .map(|(n, p)| (n.to_owned(), p.to_owned())),
            "{version}"
        );
        let (_dir, talosconfig) = talosconfig(&b, TalosRole::Admin, &format!("volumes-{host}"));
        let out = conformance(&[
            "--endpoint",
            &node.addr().to_string(),
            "--talosconfig",
            talosconfig.to_str().expect("path"),
            "--admin",
        ])
        .await;
        for prefix in [
            "resource VolumeStatuses.block.talos.dev runtime/u-data ",
            "resource VolumeStatuses.block.talos.dev runtime/u-nowhere ",
            "resource VolumeStatuses.block.talos.dev runtime/u-whole ",
            "resource VolumeStatuses.block.talos.dev runtime/u-shared ",
            "resource VolumeStatuses.block.talos.dev runtime/STATE ",
            "resource DiscoveredVolumes.block.talos.dev runtime/vdb1 ",
            "resource DiscoveredVolumes.block.talos.dev runtime/vdc ",
        ] {
            assert!(
                out.lines().any(|l| l.starts_with(prefix)),
                "{version}: no `{prefix}` in:\n{out}"
            );
        }
        node.stop().await;
    }
}

#[tokio::test]
async fn the_live_config_reads_as_applied_with_os_admin_only() {
    let b = bundle_for(60);
    let applied = config(&b, Role::ControlPlane, "v1.14.1");
    let node = SimNode::start_configured(
        "127.0.0.1:0".parse().expect("addr"),
        "v1.14.1",
        Hardware::vm(60),
        &applied,
    )
    .await
    .expect("start a configured node");
    let admin = support::admin(&b, node.addr()).await;
    assert_eq!(admin.live_config().await.expect("read as admin"), applied);
    let reader = TalosClient::connect(
        &node.addr().to_string(),
        &credentials(&b, TalosRole::Reader),
    )
    .await
    .expect("connect as reader");
    let refused = reader.live_config().await.expect_err("sensitive");
    assert!(refused.to_string().contains("not authorized"), "{refused}");
}
