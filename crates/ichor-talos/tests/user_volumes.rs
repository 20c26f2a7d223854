//! User volumes on simulated nodes, read with [`TalosClient::user_volumes`] and as raw
//! `VolumeStatuses.block.talos.dev` resources (`crates/ichor-sim/docs/user-volumes.md`): a
//! selector that picks a disk gives a `ready` partition, one that picks none a `failed`
//! volume, and the statuses follow the running config live, on 1.13 and 1.14.

mod support;

use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::SecretsBundle;
use ichor_sim::{Hardware, SimDisk, SimNode, Stage};
use ichor_talos::api::cosi::resource::state_client::StateClient;
use ichor_talos::api::cosi::resource::{
    EventType, GetRequest, Resource, WatchOptions, WatchRequest,
};
use ichor_talos::api::resource::definitions::block::VolumeStatusSpec;
use ichor_talos::api::storage::storage_service_client::StorageServiceClient;
use ichor_talos::api::storage::{BlockDeviceWipeDescriptor, BlockDeviceWipeRequest};
use ichor_talos::{ApplyMode, TalosClient, UserVolumeStatus};
use ichor_testenv::nets::TALOS_USER_VOLUMES;
use ichor_testenv::wait::eventually;
use prost::Message as _;
use support::{WAIT, bundle_for, config};
use tokio_stream::StreamExt as _;

const VOLUME_STATUS: &str = "VolumeStatuses.block.talos.dev";
const VERSIONS: [&str; 2] = ["v1.13.9", "v1.14.1"];

/// A VM with a second, empty 50 GB disk `vdb` beside its system disk `vda`.
fn hardware(seed: u32) -> Hardware {
    let mut hardware = Hardware::vm(seed);
    hardware.disks.push(SimDisk {
        name: "vdb".into(),
        size: 50_000_000_000,
        cdrom: false,
        transport: "virtio".into(),
        model: String::new(),
        serial: format!("SIMB{seed:04}"),
    });
    hardware
}

/// A `UserVolumeConfig` document.
fn user_volume(name: &str, selector: &str, rest: &str) -> String {
    format!(
        "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: {name}\nprovisioning:\n  diskSelector:\n    match: {selector}\n  minSize: 1GiB\n{rest}"
    )
}

/// A control plane's config for `version` with these extra documents.
fn with_documents(b: &SecretsBundle, version: &str, documents: &[String]) -> String {
    let mut text = config(b, Role::ControlPlane, version);
    for d in documents {
        text = format!("{}\n---\n{d}", text.trim_end());
    }
    text
}

/// A configured control plane booted with these documents, on 127.0.172.`host`, and an
/// admin client.
async fn booted(
    version: &str,
    host: u8,
    documents: &[String],
) -> (SimNode, TalosClient, SecretsBundle) {
    let b = bundle_for(host);
    let node = SimNode::start_configured(
        (TALOS_USER_VOLUMES.ip(0, host), 0).into(),
        version,
        hardware(u32::from(host)),
        &with_documents(&b, version, documents),
    )
    .await
    .expect("start a configured node");
    let admin = support::admin(&b, node.addr()).await;
    (node, admin, b)
}

/// The user volumes once they have all left `waiting`.
async fn settled(client: &TalosClient, count: usize) -> Vec<UserVolumeStatus> {
    let probe = client.clone();
    eventually("the user volumes to settle", WAIT, || {
        let client = probe.clone();
        async move {
            client
                .user_volumes()
                .await
                .is_ok_and(|v| v.len() == count && v.iter().all(|v| v.phase != "waiting"))
        }
    })
    .await;
    client.user_volumes().await.expect("user volumes")
}

async fn get(client: &TalosClient, id: &str) -> Result<Resource, tonic::Status> {
    StateClient::new(client.channel())
        .get(GetRequest {
            namespace: "runtime".into(),
            r#type: VOLUME_STATUS.into(),
            id: id.into(),
            options: None,
        })
        .await
        .map(|r| r.into_inner().resource.expect("a resource"))
}

fn yaml_of(resource: &Resource) -> String {
    resource.spec.clone().unwrap_or_default().yaml_spec
}

fn proto_of(resource: &Resource) -> VolumeStatusSpec {
    VolumeStatusSpec::decode(
        resource
            .spec
            .clone()
            .unwrap_or_default()
            .proto_spec
            .as_slice(),
    )
    .expect("a VolumeStatusSpec")
}

#[tokio::test]
async fn a_selected_disk_gives_ready_partitions() {
    for (i, version) in VERSIONS.into_iter().enumerate() {
        let host = 1 + u8::try_from(i).expect("small");
        let (node, admin, _) = booted(
            version,
            host,
            &[
                user_volume(
                    "data",
                    "disk.dev_path == '/dev/vdb'",
                    "  maxSize: 10GiB\nfilesystem:\n  type: ext4\n",
                ),
                user_volume("spill", "'!system_disk && disk.size > 10u * GB'", ""),
            ],
        )
        .await;
        let volumes = settled(&admin, 2).await;
        // The one with a max size is provisioned first; the other takes the rest of vdb.
        assert_eq!(
            volumes,
            vec![
                UserVolumeStatus {
                    name: "data".into(),
                    phase: "ready".into(),
                    size: Some("11 GB".into()),
                    location: Some("/dev/vdb1".into()),
                    error: None,
                },
                UserVolumeStatus {
                    name: "spill".into(),
                    phase: "ready".into(),
                    size: Some("39 GB".into()),
                    location: Some("/dev/vdb2".into()),
                    error: None,
                },
            ],
            "{version}"
        );
        let data = get(&admin, "u-data").await.expect("u-data");
        let labels = &data.metadata.clone().unwrap_or_default().labels;
        assert_eq!(
            labels.get("talos.dev/user-volume").map(String::as_str),
            Some(""),
            "{version}: the user-volume label"
        );
        let spec = proto_of(&data);
        assert_eq!(
            (spec.phase, spec.r#type, spec.filesystem),
            (6, 0, 3),
            "{version}"
        );
        assert_eq!(spec.size, 10 * 1024 * 1024 * 1024);
        let yaml = yaml_of(&data);
        for line in [
            "phase: ready",
            "type: partition",
            "location: /dev/vdb1",
            "mountLocation: /dev/vdb1",
            "partitionIndex: 1",
            "parentLocation: /dev/vdb",
            "prettySize: 11 GB",
            "filesystem: ext4",
            "    targetPath: data",
            "    selinuxLabel: system_u:object_r:ephemeral_t:s0",
            "    projectQuotaSupport: false",
            "    parentId: /var/mnt",
            "    fileMode: 493",
        ] {
            assert!(
                yaml.lines().any(|l| l == line),
                "{version}: no `{line}` in\n{yaml}"
            );
        }
        // Found by label on a later boot, not right after it was made.
        assert!(!yaml.contains("uuid:"), "{version}:\n{yaml}");
        assert!(
            !yaml.contains("secure") && !yaml.contains("noExec"),
            "{yaml}"
        );
        // MountSpec's secure and noExec came with 1.14: STATE shows them only there.
        let state = yaml_of(&get(&admin, "STATE").await.expect("STATE"));
        assert_eq!(
            state.contains("secure: true"),
            version == "v1.14.1",
            "{version}: STATE\n{state}"
        );
        let state = proto_of(&get(&admin, "STATE").await.expect("STATE"));
        let mount = state.mount_spec.unwrap_or_default();
        assert_eq!(mount.secure || mount.no_exec, version == "v1.14.1");
        node.stop().await;
    }
}

#[tokio::test]
async fn a_selector_that_matches_nothing_fails() {
    for (i, version) in VERSIONS.into_iter().enumerate() {
        let host = 11 + u8::try_from(i).expect("small");
        let (node, admin, _) = booted(
            version,
            host,
            &[user_volume("data", "disk.size > 10u * TB", "")],
        )
        .await;
        assert_eq!(
            settled(&admin, 1).await,
            vec![UserVolumeStatus {
                name: "data".into(),
                phase: "failed".into(),
                size: None,
                location: None,
                error: Some("no disks matched selector for volume".into()),
            }],
            "{version}"
        );
        let data = get(&admin, "u-data").await.expect("u-data");
        let spec = proto_of(&data);
        // It failed while waiting: the zero phase, left out of both encodings.
        assert_eq!((spec.phase, spec.pre_fail_phase), (1, 0), "{version}");
        assert_eq!(spec.error_message, "no disks matched selector for volume");
        let yaml = yaml_of(&data);
        assert!(!yaml.contains("location"), "{version}:\n{yaml}");
        assert!(
            yaml.contains("mountSpec:\n    targetPath: data\n"),
            "{yaml}"
        );
        assert!(
            yaml.ends_with("errorMessage: no disks matched selector for volume\n"),
            "{yaml}"
        );
        node.stop().await;
    }
}

#[tokio::test]
async fn user_volumes_follow_the_running_config_live() {
    for (i, version) in VERSIONS.into_iter().enumerate() {
        let host = 21 + u8::try_from(i).expect("small");
        let (node, admin, b) = booted(
            version,
            host,
            &[user_volume("data", "disk.size > 10u * TB", "")],
        )
        .await;
        assert_eq!(settled(&admin, 1).await[0].phase, "failed");
        let mut watch = StateClient::new(admin.channel())
            .watch(WatchRequest {
                namespace: "runtime".into(),
                r#type: VOLUME_STATUS.into(),
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

        // The selector is fixed and a second volume added, without a reboot.
        let fixed = user_volume("data", "disk.dev_path == '/dev/vdb'", "  maxSize: 5GB\n");
        let logs = user_volume("logs", "'!system_disk'", "  maxSize: 2GB\n");
        let applied = admin
            .apply_configuration(
                with_documents(&b, version, &[fixed.clone(), logs.clone()]).as_bytes(),
                ApplyMode::Auto,
            )
            .await
            .expect("apply");
        assert_eq!(applied.mode, "NO_REBOOT", "{version}");
        let volumes = settled(&admin, 2).await;
        assert_eq!(
            volumes
                .iter()
                .map(|v| (v.name.as_str(), v.phase.as_str(), v.location.as_deref()))
                .collect::<Vec<_>>(),
            vec![
                ("data", "ready", Some("/dev/vdb2")),
                ("logs", "ready", Some("/dev/vdb1")),
            ],
            "{version}: the smaller maxSize goes first"
        );
        assert_eq!(volumes[1].size.as_deref(), Some("2.0 GB"));

        // `logs` is removed: its status is destroyed, its partition stays.
        admin
            .apply_configuration(
                with_documents(&b, version, std::slice::from_ref(&fixed)).as_bytes(),
                ApplyMode::NoReboot,
            )
            .await
            .expect("apply");
        let after = settled(&admin, 1).await;
        assert_eq!(after[0].name, "data");
        let gone = get(&admin, "u-logs").await.expect_err("u-logs is gone");
        assert_eq!(gone.code(), tonic::Code::NotFound);
        let mut seen = Vec::new();
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        while !seen.contains(&(EventType::Destroyed as i32, "u-logs".to_owned())) {
            let message = tokio::time::timeout_at(deadline, watch.next())
                .await
                .expect("the watch sees u-logs go")
                .expect("the watch goes on")
                .expect("a watch message");
            for e in message.event {
                let id = e.resource.and_then(|r| r.metadata).map(|m| m.id);
                seen.push((e.event_type, id.unwrap_or_default()));
            }
        }
        for expected in [
            (EventType::Created as i32, "u-data"),
            (EventType::Updated as i32, "u-data"),
            (EventType::Created as i32, "u-logs"),
        ] {
            assert!(
                seen.contains(&(expected.0, expected.1.to_owned())),
                "{version}: {expected:?} in {seen:?}"
            );
        }

        // Added again, it finds its partition by label.
        admin
            .apply_configuration(
                with_documents(&b, version, &[fixed, logs]).as_bytes(),
                ApplyMode::NoReboot,
            )
            .await
            .expect("apply");
        let again = settled(&admin, 2).await;
        assert_eq!(again[1].location.as_deref(), Some("/dev/vdb1"), "{version}");
        assert_eq!(node.stage().await, Stage::Running, "no reboot");
        node.stop().await;
    }
}

#[tokio::test]
async fn a_reboot_locates_volumes_by_label() {
    for (i, version) in VERSIONS.into_iter().enumerate() {
        let host = 31 + u8::try_from(i).expect("small");
        let (node, admin, b) = booted(
            version,
            host,
            &[user_volume("data", "disk.dev_path == '/dev/vdb'", "")],
        )
        .await;
        let first = settled(&admin, 1).await;
        assert_eq!(first[0].phase, "ready");
        // A selector and a filesystem change do nothing to a ready volume.
        let changed = user_volume(
            "data",
            "disk.dev_path == '/dev/nothing'",
            "filesystem:\n  type: ext4\n",
        );
        admin
            .apply_configuration(
                with_documents(&b, version, &[changed]).as_bytes(),
                ApplyMode::NoReboot,
            )
            .await
            .expect("apply");
        assert_eq!(settled(&admin, 1).await, first, "{version}");
        // A volume's disk is not wiped from under it.
        let refused = StorageServiceClient::new(admin.channel())
            .block_device_wipe(BlockDeviceWipeRequest {
                devices: vec![BlockDeviceWipeDescriptor {
                    device: "vdb".into(),
                    ..Default::default()
                }],
            })
            .await
            .expect_err("vdb is in use");
        assert_eq!(
            refused.message(),
            "blockdevice \"vdb\" is in use by volume \"u-data\"",
            "{version}"
        );

        // After a reboot the partition is found by its label (with its filesystem's UUID), and
        // the filesystem the config now asks for is not the one there.
        node.reboot().await.expect("reboot");
        let admin = support::admin(&b, node.addr()).await;
        let rebooted = settled(&admin, 1).await;
        assert_eq!(
            rebooted[0].error.as_deref(),
            Some("filesystem type mismatch: xfs != ext4"),
            "{version}"
        );
        let spec = proto_of(&get(&admin, "u-data").await.expect("u-data"));
        assert_eq!(spec.location, "/dev/vdb1");
        assert!(!spec.uuid.is_empty(), "{version}: located, with its UUID");
        // Set back to xfs, it is ready again without a reboot.
        admin
            .apply_configuration(
                with_documents(
                    &b,
                    version,
                    &[user_volume("data", "disk.dev_path == '/dev/nothing'", "")],
                )
                .as_bytes(),
                ApplyMode::NoReboot,
            )
            .await
            .expect("apply");
        let probe = admin.clone();
        eventually("the volume is ready again", WAIT, || {
            let client = probe.clone();
            async move {
                client
                    .user_volumes()
                    .await
                    .is_ok_and(|v| v.len() == 1 && v[0].phase == "ready")
            }
        })
        .await;
        node.stop().await;
    }
}
