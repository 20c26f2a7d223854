//! The hardware and block resources of a node (talos-facts §8.1, §13.5): SMBIOS identity, the
//! disks, what probing them finds (the boot ISO, once installed the system disk's partitions,
//! and what user volumes wrote), the system disk, the status of the system volumes META, STATE
//! and EPHEMERAL, and that of the user volumes (`crate::volumes`).
//!
//! An installed system disk is partitioned as Talos's UEFI install lays it out: EFI (vfat),
//! META, STATE (xfs) and EPHEMERAL (xfs, the rest of the disk), from 1 MiB on. Identifiers
//! a real disk gets at random (GUIDs, filesystem UUIDs) are derived from the machine's UUID,
//! so they stay the same for a machine.

use std::time::Duration;

use ichor_talos::api::resource::definitions::block::{
    DiscoveredVolumeSpec, DiskSpec, MountSpec, SystemDiskSpec, VolumeStatusSpec,
};
use ichor_talos::api::resource::definitions::enums::{
    BlockFilesystemType, BlockVolumePhase, BlockVolumeType,
};
use ichor_talos::api::resource::definitions::hardware::SystemInformationSpec;
use prost::Message as _;
use serde_json::Value;

use super::Wanted;
use super::store::Res;
use super::yaml::{Fields, Yaml, marshal};
use crate::Node;
use crate::hardware::SimDisk;
use crate::volumes::{self, DiskContent, derived_uuid, partition_name};

const NAMESPACE: &str = "runtime";
const DISK: &str = "Disks.block.talos.dev";
const DISCOVERED_VOLUME: &str = "DiscoveredVolumes.block.talos.dev";
const SYSTEM_DISK: &str = "SystemDisks.block.talos.dev";
const VOLUME_STATUS: &str = "VolumeStatuses.block.talos.dev";
const SYSTEM_INFORMATION: &str = "SystemInformations.hardware.talos.dev";

/// The types the volume manager's state shows in: it runs before they are read.
pub(crate) const VOLUME_TYPES: &[&str] = &[DISCOVERED_VOLUME, VOLUME_STATUS];

const MIB: u64 = 1024 * 1024;
/// GPT partition type GUIDs.
const EFI_SYSTEM: &str = "C12A7328-F81F-11D2-BA4B-00A0C93EC93B";
const LINUX_DATA: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";

/// `humanize.Bytes`: SI units, one decimal below 10.
pub(crate) fn pretty_size(size: u64) -> String {
    const UNITS: [&str; 7] = ["B", "kB", "MB", "GB", "TB", "PB", "EB"];
    if size < 10 {
        return format!("{size} B");
    }
    #[allow(clippy::cast_precision_loss)]
    let value = size as f64;
    let exponent = (value.ln() / 1000f64.ln()).floor();
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let unit = UNITS[(exponent as usize).min(UNITS.len() - 1)];
    let scaled = (value / 1000f64.powf(exponent) * 10.0 + 0.5).floor() / 10.0;
    if scaled < 10.0 {
        format!("{scaled:.1} {unit}")
    } else {
        format!("{scaled:.0} {unit}")
    }
}

/// One partition of an installed system disk.
struct Partition {
    index: u64,
    label: &'static str,
    type_guid: &'static str,
    /// The probed filesystem (blkid name), and its filesystem label.
    filesystem: &'static str,
    offset: u64,
    size: u64,
}

/// Where the partitions of an installed system disk of `disk_size` bytes are: (offset, size)
/// in bytes.
pub(crate) fn system_layout(disk_size: u64) -> Vec<(u64, u64)> {
    layout(disk_size)
        .iter()
        .map(|p| (p.offset, p.size))
        .collect()
}

/// Talos's UEFI layout (EFI of `UKIEFISize`, META 1 MiB, STATE 100 MiB, EPHEMERAL to the end
/// of the disk, 1 MiB-aligned, with room for the backup GPT).
fn layout(disk_size: u64) -> Vec<Partition> {
    let efi = (100 + 1 + 1000) * MIB;
    let mut offset = MIB;
    let mut out = Vec::new();
    for (index, label, type_guid, filesystem, size) in [
        (1, "EFI", EFI_SYSTEM, "vfat", efi),
        (2, "META", LINUX_DATA, "talosmeta", MIB),
        (3, "STATE", LINUX_DATA, "xfs", 100 * MIB),
        (4, "EPHEMERAL", LINUX_DATA, "xfs", 0),
    ] {
        let size = if size == 0 {
            (disk_size.saturating_sub(offset + 33 * 512) / MIB) * MIB
        } else {
            size
        };
        out.push(Partition {
            index,
            label,
            type_guid,
            filesystem,
            offset,
            size,
        });
        offset += size;
    }
    out
}

fn sector_size(disk: &SimDisk) -> u64 {
    if disk.cdrom { 2048 } else { 512 }
}

fn disk(d: &SimDisk) -> Res {
    let sector = sector_size(d);
    let spec = DiskSpec {
        size: d.size,
        io_size: sector,
        sector_size: sector,
        readonly: false,
        model: d.model.clone(),
        serial: d.serial.clone(),
        sub_system: "/sys/class/block".into(),
        transport: d.transport.clone(),
        cdrom: d.cdrom,
        dev_path: format!("/dev/{}", d.name),
        pretty_size: pretty_size(d.size),
        ..Default::default()
    };
    let yaml = Fields::new()
        .field("dev_path", Yaml::str(&spec.dev_path))
        .field("size", Yaml::int(d.size))
        .field("pretty_size", Yaml::str(&spec.pretty_size))
        .field("io_size", Yaml::int(sector))
        .field("sector_size", Yaml::int(sector))
        .field("readonly", Yaml::Bool(false))
        .field("cdrom", Yaml::Bool(d.cdrom))
        .omitempty("model", Yaml::str(&d.model))
        .omitempty("serial", Yaml::str(&d.serial))
        .omitempty("sub_system", Yaml::str(&spec.sub_system))
        .omitempty("transport", Yaml::str(&d.transport))
        .done();
    Res::new(
        NAMESPACE,
        DISK,
        d.name.clone(),
        "block.DisksController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

/// A probed block device or partition.
#[derive(Default)]
struct Probed {
    id: String,
    kind: &'static str,
    parent: String,
    offset: u64,
    size: u64,
    sector: u64,
    name: String,
    uuid: String,
    label: String,
    partition_uuid: String,
    partition_type: String,
    partition_label: String,
    partition_index: u64,
}

fn discovered(p: &Probed) -> Res {
    let parent_dev = if p.parent.is_empty() {
        String::new()
    } else {
        format!("/dev/{}", p.parent)
    };
    let spec = DiscoveredVolumeSpec {
        size: p.size,
        sector_size: p.sector,
        io_size: p.sector,
        name: p.name.clone(),
        uuid: p.uuid.clone(),
        label: p.label.clone(),
        partition_uuid: p.partition_uuid.clone(),
        partition_type: p.partition_type.clone(),
        partition_label: p.partition_label.clone(),
        partition_index: p.partition_index,
        r#type: p.kind.into(),
        parent: p.parent.clone(),
        dev_path: format!("/dev/{}", p.id),
        parent_dev_path: parent_dev.clone(),
        pretty_size: pretty_size(p.size),
        offset: p.offset,
        ..Default::default()
    };
    let yaml = Fields::new()
        .field("dev_path", Yaml::str(&spec.dev_path))
        .field("type", Yaml::str(p.kind))
        .field("device_path", Yaml::str(""))
        .omitempty("parent", Yaml::str(&p.parent))
        .omitempty("parent_dev_path", Yaml::str(&parent_dev))
        .field("offset", Yaml::int(p.offset))
        .field("size", Yaml::int(p.size))
        .field("pretty_size", Yaml::str(&spec.pretty_size))
        .omitempty("sector_size", Yaml::int(p.sector))
        .omitempty("io_size", Yaml::int(p.sector))
        .field("name", Yaml::str(&p.name))
        .omitempty("uuid", Yaml::str(&p.uuid))
        .omitempty("label", Yaml::str(&p.label))
        .omitempty("partition_uuid", Yaml::str(&p.partition_uuid))
        .omitempty("partition_type", Yaml::str(&p.partition_type))
        .omitempty("partition_label", Yaml::str(&p.partition_label))
        .omitempty("partition_index", Yaml::int(p.partition_index))
        .done();
    Res::new(
        NAMESPACE,
        DISCOVERED_VOLUME,
        p.id.clone(),
        "block.DiscoveryController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

/// The ISO volume id of the boot image (`iso.VolumeID(iso.Label(version))`).
fn iso_label(version: &str) -> String {
    format!("Talos-{version}")
        .to_uppercase()
        .chars()
        .filter_map(|c| match c {
            'A'..='Z' | '0'..='9' => Some(c),
            '_' | '-' | '.' => Some('_'),
            _ => None,
        })
        .take(32)
        .collect()
}

/// What the node's trim settings are (`FilesystemTrimConfig.interval`, talos-facts §13.5).
fn trim_interval(config: Option<&Vec<Value>>) -> Option<Duration> {
    let text = config?
        .iter()
        .find(|d| d["kind"] == "FilesystemTrimConfig")?["interval"]
        .as_str()?
        .to_owned();
    parse_go_duration(&text).filter(|d| !d.is_zero())
}

/// A Go duration of hours, minutes and seconds (`168h0m0s`); `None` past Go's range (a
/// `time.Duration` holds at most 2^63-1 ns), as `time.ParseDuration` refuses it.
fn parse_go_duration(text: &str) -> Option<Duration> {
    const GO_MAX_SECONDS: u64 = i64::MAX as u64 / 1_000_000_000;
    let mut total = 0u64;
    let mut number = String::new();
    for c in text.chars() {
        if c.is_ascii_digit() {
            number.push(c);
            continue;
        }
        let n: u64 = number.parse().ok()?;
        number.clear();
        let unit = match c {
            'h' => 3600,
            'm' => 60,
            's' => 1,
            _ => return None,
        };
        total = total.checked_add(n.checked_mul(unit)?)?;
    }
    (number.is_empty() && total <= GO_MAX_SECONDS).then(|| Duration::from_secs(total))
}

/// `time.Duration.String()` for whole seconds.
fn go_duration(d: Duration) -> String {
    let s = d.as_secs();
    match (s / 3600, s / 60 % 60, s % 60) {
        (0, 0, sec) => format!("{sec}s"),
        (0, min, sec) => format!("{min}m{sec}s"),
        (h, min, sec) => format!("{h}h{min}m{sec}s"),
    }
}

/// A system volume's status.
struct Volume<'a> {
    id: &'static str,
    phase: BlockVolumePhase,
    partition: Option<(&'a str, &'a Partition, String, String)>,
    mount: Option<(&'static str, &'static str, u32, bool, bool, bool)>,
    trim: Option<Duration>,
}

/// A system volume's status. `secure` and `noExec` are fields of `MountSpec` from 1.14 on
/// (`pkg/machinery/resources/block/volume_config.go`): a 1.13 node has neither.
fn volume_status(v: &Volume<'_>, v14: bool) -> Res {
    let phase_name = match v.phase {
        BlockVolumePhase::VolumePhaseReady => "ready",
        BlockVolumePhase::VolumePhaseMissing => "missing",
        _ => "waiting",
    };
    let mut spec = VolumeStatusSpec {
        phase: v.phase as i32,
        r#type: BlockVolumeType::VolumeTypePartition as i32,
        ..Default::default()
    };
    let mut yaml = Fields::new()
        .field("phase", Yaml::str(phase_name))
        .field("type", Yaml::str("partition"));
    if let Some((disk, p, fs_uuid, part_uuid)) = &v.partition {
        let location = format!("/dev/{}", partition_name(disk, p.index));
        let filesystem = p.filesystem == "xfs";
        spec.location.clone_from(&location);
        spec.mount_location.clone_from(&location);
        spec.partition_index = i64::try_from(p.index).unwrap_or(0);
        spec.parent_location = format!("/dev/{disk}");
        spec.uuid = if filesystem {
            fs_uuid.clone()
        } else {
            String::new()
        };
        spec.partition_uuid.clone_from(part_uuid);
        spec.size = p.size;
        spec.pretty_size = pretty_size(p.size);
        if filesystem {
            spec.filesystem = BlockFilesystemType::FilesystemTypeXfs as i32;
        }
        yaml = yaml
            .field("location", Yaml::str(&location))
            .field("mountLocation", Yaml::str(&location))
            .field("partitionIndex", Yaml::int(p.index))
            .field("parentLocation", Yaml::str(&spec.parent_location))
            .omitempty("uuid", Yaml::str(&spec.uuid))
            .field("partitionUUID", Yaml::str(part_uuid))
            .field("size", Yaml::int(p.size))
            .field("prettySize", Yaml::str(&spec.pretty_size))
            .omitempty("filesystem", Yaml::str(if filesystem { "xfs" } else { "" }));
    }
    if let Some(trim) = v.trim {
        spec.trim_enabled = true;
        spec.trim_interval = prost_types::Duration::try_from(trim).ok();
        yaml = yaml
            .field("trimEnabled", Yaml::Bool(true))
            .field("trimInterval", Yaml::str(go_duration(trim)));
    }
    if let Some((target, selinux, mode, quota, secure, no_exec)) = v.mount {
        let (secure, no_exec) = (secure && v14, no_exec && v14);
        spec.mount_spec = Some(MountSpec {
            target_path: target.into(),
            selinux_label: selinux.into(),
            project_quota_support: quota,
            file_mode: mode,
            secure,
            no_exec,
            ..Default::default()
        });
        yaml = yaml.field(
            "mountSpec",
            Fields::new()
                .field("targetPath", Yaml::str(target))
                .field("selinuxLabel", Yaml::str(selinux))
                .field("projectQuotaSupport", Yaml::Bool(quota))
                .omitempty("fileMode", Yaml::int(mode))
                .omitempty("secure", Yaml::Bool(secure))
                .omitempty("noExec", Yaml::Bool(no_exec))
                .done(),
        );
    }
    let mut res = Res::new(
        NAMESPACE,
        VOLUME_STATUS,
        v.id,
        "block.VolumeManagerController",
        marshal(&yaml.done()),
        spec.encode_to_vec(),
    );
    // The system volumes' configs carry this label, and the manager copies it.
    res.labels
        .insert("talos.dev/system-volume".into(), String::new());
    res
}

/// `BlockVolumePhase` as YAML (`volumephase_enumer.go`).
fn phase_name(phase: BlockVolumePhase) -> &'static str {
    match phase {
        BlockVolumePhase::VolumePhaseWaiting => "waiting",
        BlockVolumePhase::VolumePhaseFailed => "failed",
        BlockVolumePhase::VolumePhaseMissing => "missing",
        BlockVolumePhase::VolumePhaseLocated => "located",
        BlockVolumePhase::VolumePhaseProvisioned => "provisioned",
        BlockVolumePhase::VolumePhasePrepared => "prepared",
        BlockVolumePhase::VolumePhaseReady => "ready",
        BlockVolumePhase::VolumePhaseClosed => "closed",
    }
}

/// A user volume's status (`crates/ichor-sim/docs/user-volumes.md` §2): labelled
/// `talos.dev/user-volume` (copied from its volume config, `block.UserVolumeLabel`), the mount
/// spec of `UserVolumeTransformer` (`volumeconfig/user_volumes.go`: target `<name>` under
/// `/var/mnt`, mode 0755; no `secure` or `noExec`), trim and scrub on 1.14 only.
fn user_volume_status(id: &str, v: &volumes::Status, v14: bool) -> Res {
    let name = id.strip_prefix(volumes::PREFIX).unwrap_or(id);
    let (kind, kind_name) = v.kind.wire();
    let pretty = if v.size == 0 {
        String::new()
    } else {
        pretty_size(v.size)
    };
    let mut spec = VolumeStatusSpec {
        phase: v.phase as i32,
        pre_fail_phase: v.pre_fail_phase as i32,
        r#type: kind as i32,
        location: v.location.clone(),
        mount_location: v.mount_location.clone(),
        partition_index: i64::try_from(v.partition_index).unwrap_or(0),
        parent_location: v.parent_location.clone(),
        uuid: v.uuid.clone(),
        partition_uuid: v.partition_uuid.clone(),
        size: v.size,
        pretty_size: pretty.clone(),
        filesystem: v.filesystem.map_or(0, |f| f.proto() as i32),
        error_message: v.error.clone(),
        ..Default::default()
    };
    let mut yaml = Fields::new()
        .field("phase", Yaml::str(phase_name(v.phase)))
        .omitempty(
            "preFailPhase",
            if v.pre_fail_phase == BlockVolumePhase::VolumePhaseWaiting {
                Yaml::str("")
            } else {
                Yaml::str(phase_name(v.pre_fail_phase))
            },
        )
        .field("type", Yaml::str(kind_name))
        .omitempty("location", Yaml::str(&v.location))
        .omitempty("mountLocation", Yaml::str(&v.mount_location))
        .omitempty("partitionIndex", Yaml::int(v.partition_index))
        .omitempty("parentLocation", Yaml::str(&v.parent_location))
        .omitempty("uuid", Yaml::str(&v.uuid))
        .omitempty("partitionUUID", Yaml::str(&v.partition_uuid))
        .omitempty("size", Yaml::int(v.size))
        .omitempty("prettySize", Yaml::str(&pretty))
        .omitempty(
            "filesystem",
            Yaml::str(v.filesystem.map_or("", volumes::Filesystem::name)),
        );
    // The resolved trim and scrub settings are status fields from 1.14 on.
    if let Some(d) = v.trim.filter(|_| v14) {
        spec.trim_enabled = true;
        spec.trim_interval = prost_types::Duration::try_from(d).ok();
        yaml = yaml
            .field("trimEnabled", Yaml::Bool(true))
            .field("trimInterval", Yaml::str(volumes::go_duration(d)));
    }
    if let Some(d) = v.scrub.filter(|_| v14) {
        spec.scrub_enabled = true;
        spec.scrub_interval = prost_types::Duration::try_from(d).ok();
        yaml = yaml
            .field("scrubEnabled", Yaml::Bool(true))
            .field("scrubInterval", Yaml::str(volumes::go_duration(d)));
    }
    if let Some((quota, bind)) = v.mount {
        spec.mount_spec = Some(MountSpec {
            target_path: name.into(),
            selinux_label: volumes::SELINUX_LABEL.into(),
            project_quota_support: quota,
            parent_id: volumes::MOUNT_PARENT.into(),
            file_mode: 0o755,
            bind_target: if bind { name.into() } else { String::new() },
            ..Default::default()
        });
        yaml = yaml.field(
            "mountSpec",
            Fields::new()
                .field("targetPath", Yaml::str(name))
                .field("selinuxLabel", Yaml::str(volumes::SELINUX_LABEL))
                .field("projectQuotaSupport", Yaml::Bool(quota))
                .field("parentId", Yaml::str(volumes::MOUNT_PARENT))
                .field("fileMode", Yaml::int(0o755))
                .omitempty("bindTarget", Yaml::str(if bind { name } else { "" }))
                .done(),
        );
    }
    yaml = yaml.omitempty("errorMessage", Yaml::str(&v.error));
    let mut res = Res::new(
        NAMESPACE,
        VOLUME_STATUS,
        id,
        "block.VolumeManagerController",
        marshal(&yaml.done()),
        spec.encode_to_vec(),
    );
    res.labels
        .insert("talos.dev/user-volume".into(), String::new());
    res
}

fn system_information(node: &Node) -> Res {
    let smbios = SystemInformationSpec {
        manufacturer: "QEMU".into(),
        product_name: "Standard PC (Q35 + ICH9, 2009)".into(),
        version: "pc-q35".into(),
        serial_number: String::new(),
        uuid: node.hardware.uuid.clone(),
        wake_up_type: "Power Switch".into(),
        sku_number: String::new(),
        bios_version: String::new(),
    };
    let yaml = Fields::new()
        .omitempty("manufacturer", Yaml::str(&smbios.manufacturer))
        .omitempty("productName", Yaml::str(&smbios.product_name))
        .omitempty("version", Yaml::str(&smbios.version))
        .omitempty("biosVersion", Yaml::str(&smbios.bios_version))
        .omitempty("serialnumber", Yaml::str(&smbios.serial_number))
        .omitempty("uuid", Yaml::str(&smbios.uuid))
        .omitempty("wakeUpType", Yaml::str(&smbios.wake_up_type))
        .omitempty("skuNumber", Yaml::str(&smbios.sku_number))
        .done();
    Res::new(
        "hardware",
        SYSTEM_INFORMATION,
        "systeminformation",
        "hardware.SystemInfoController",
        marshal(&yaml),
        smbios.encode_to_vec(),
    )
}

/// The node's hardware and block resources.
pub(crate) fn resources(node: &Node, want: &Wanted) -> Vec<Res> {
    let mut out = Vec::new();
    if want.has(SYSTEM_INFORMATION) {
        out.push(system_information(node));
    }
    let uuid = &node.hardware.uuid;
    let system = node
        .installed
        .then(|| node.hardware.install_disk())
        .flatten();
    let parts = system.map(|d| layout(d.size)).unwrap_or_default();
    let ids = |p: &Partition| {
        (
            derived_uuid(&format!("{uuid}/fs/{}", p.label)),
            derived_uuid(&format!("{uuid}/partition/{}", p.label)),
        )
    };
    for d in &node.hardware.disks {
        if want.has(DISK) {
            out.push(disk(d));
        }
        if !want.has(DISCOVERED_VOLUME) {
            continue;
        }
        let sector = sector_size(d);
        let mut whole = Probed {
            id: d.name.clone(),
            kind: "disk",
            size: d.size,
            sector,
            ..Default::default()
        };
        if d.cdrom {
            whole.name = "iso9660".into();
            whole.label = iso_label(&node.talos_version);
        }
        let is_system = system.is_some_and(|s| s.name == d.name);
        let content = volumes::content(node, &d.name);
        if is_system || matches!(content, Some(DiskContent::Gpt(_))) {
            whole.name = "gpt".into();
            whole.uuid = volumes::gpt_uuid(node, &d.name);
        }
        if let Some(DiskContent::Whole(f)) = &content {
            whole.name = f.filesystem.name().into();
            whole.uuid.clone_from(&f.uuid);
        }
        out.push(discovered(&whole));
        if let Some(DiskContent::Gpt(user)) = &content {
            out.extend(user.iter().map(|p| {
                let (name, fs_uuid) = p
                    .formatted
                    .as_ref()
                    .map(|f| (f.filesystem.name(), f.uuid.clone()))
                    .unwrap_or_default();
                discovered(&Probed {
                    id: partition_name(&d.name, p.index),
                    kind: "partition",
                    parent: d.name.clone(),
                    offset: p.first_lba * sector,
                    size: p.size(),
                    sector,
                    name: name.into(),
                    uuid: fs_uuid,
                    partition_uuid: p.partition_uuid.clone(),
                    partition_type: volumes::LINUX_DATA.into(),
                    partition_label: p.label.clone(),
                    partition_index: p.index,
                    ..Default::default()
                })
            }));
        }
        if !is_system {
            continue;
        }
        for p in &parts {
            let (fs_uuid, part_uuid) = ids(p);
            let (name, label) = match p.filesystem {
                "talosmeta" => ("talosmeta", ""),
                fs => (fs, p.label),
            };
            out.push(discovered(&Probed {
                id: partition_name(&d.name, p.index),
                kind: "partition",
                parent: d.name.clone(),
                offset: p.offset,
                size: p.size,
                sector,
                name: name.into(),
                uuid: if name == "talosmeta" {
                    String::new()
                } else {
                    fs_uuid
                },
                label: label.into(),
                partition_uuid: part_uuid,
                partition_type: p.type_guid.into(),
                partition_label: p.label.into(),
                partition_index: p.index,
            }));
        }
    }
    if let Some(d) = system.filter(|_| want.has(SYSTEM_DISK)) {
        let spec = SystemDiskSpec {
            disk_id: d.name.clone(),
            dev_path: format!("/dev/{}", d.name),
        };
        let yaml = Fields::new()
            .field("diskID", Yaml::str(&spec.disk_id))
            .field("devPath", Yaml::str(&spec.dev_path))
            .done();
        out.push(Res::new(
            NAMESPACE,
            SYSTEM_DISK,
            "system-disk",
            "block.SystemDiskController",
            marshal(&yaml),
            spec.encode_to_vec(),
        ));
    }
    if want.has(VOLUME_STATUS) {
        out.extend(volume_statuses(node, system, &parts));
        out.extend(
            volumes::statuses(node)
                .iter()
                .map(|(id, status)| user_volume_status(id, status, node.shared.is_1_14())),
        );
    }
    out
}

/// The system volumes (talos-facts §13.5): META and STATE are looked for on every boot,
/// EPHEMERAL only once there is a config.
fn volume_statuses(node: &Node, system: Option<&SimDisk>, parts: &[Partition]) -> Vec<Res> {
    let uuid = &node.hardware.uuid;
    let ids = |p: &Partition| {
        (
            derived_uuid(&format!("{uuid}/fs/{}", p.label)),
            derived_uuid(&format!("{uuid}/partition/{}", p.label)),
        )
    };
    let mut out = Vec::new();
    let v14 = node.shared.is_1_14();
    let config = node.running.as_ref().or(node.persisted.as_ref());
    let documents = config.map(|c| std::sync::Arc::clone(&c.documents));
    let trim = trim_interval(documents.as_deref());
    let found = |label: &str| {
        system.and_then(|d| {
            parts.iter().find(|p| p.label == label).map(|p| {
                let (fs, part) = ids(p);
                (d.name.as_str(), p, fs, part)
            })
        })
    };
    let located = |label: &str, absent: BlockVolumePhase| {
        if found(label).is_some() {
            BlockVolumePhase::VolumePhaseReady
        } else {
            absent
        }
    };
    out.push(volume_status(
        &Volume {
            id: "META",
            phase: located("META", BlockVolumePhase::VolumePhaseMissing),
            partition: found("META"),
            mount: None,
            trim: None,
        },
        v14,
    ));
    out.push(volume_status(
        &Volume {
            id: "STATE",
            phase: located("STATE", BlockVolumePhase::VolumePhaseMissing),
            partition: found("STATE"),
            mount: Some((
                "/system/state",
                "system_u:object_r:system_state_t:s0",
                0o700,
                false,
                true,
                true,
            )),
            trim: config.and(trim),
        },
        v14,
    ));
    if let Some(documents) = &documents {
        let v1alpha1 = documents
            .iter()
            .find(|d| d["version"] == "v1alpha1" && d.get("kind").is_none());
        let quota = v1alpha1.is_some_and(|d| d["machine"]["features"]["diskQuotaSupport"] == true);
        let secure = documents.iter().any(|d| {
            d["kind"] == "VolumeConfig" && d["name"] == "EPHEMERAL" && d["mount"]["secure"] == true
        });
        out.push(volume_status(
            &Volume {
                id: "EPHEMERAL",
                phase: located("EPHEMERAL", BlockVolumePhase::VolumePhaseWaiting),
                partition: found("EPHEMERAL"),
                mount: Some((
                    "/var",
                    "system_u:object_r:ephemeral_t:s0",
                    0o755,
                    quota,
                    secure,
                    false,
                )),
                trim,
            },
            v14,
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn trim_intervals_past_gos_range_are_refused_not_wrapped() {
        assert_eq!(
            parse_go_duration("168h0m0s"),
            Some(Duration::from_secs(7 * 86_400))
        );
        assert_eq!(
            parse_go_duration("2562047h"),
            Some(Duration::from_secs(2_562_047 * 3600))
        );
        for text in [
            "2562048h",
            "18446744073709551615h",
            "99999999999999999999s",
            "5124095576030431h5124095576030431h",
        ] {
            assert_eq!(parse_go_duration(text), None, "{text}");
        }
    }

    #[test]
    fn sizes_read_as_humanize_writes_them() {
        assert_eq!(pretty_size(100_000_000_000), "100 GB");
        assert_eq!(pretty_size(100 * MIB), "105 MB");
        assert_eq!(pretty_size(MIB), "1.0 MB");
        assert_eq!(pretty_size(5), "5 B");
    }

    #[test]
    fn the_boot_iso_is_labelled_by_version() {
        assert_eq!(iso_label("v1.14.1"), "TALOS_V1_14_1");
    }

    #[test]
    fn durations_round_trip_go_text() {
        let week = parse_go_duration("168h0m0s").expect("duration");
        assert_eq!(week, Duration::from_secs(7 * 24 * 3600));
        assert_eq!(go_duration(week), "168h0m0s");
        assert_eq!(go_duration(Duration::from_secs(90)), "1m30s");
    }

    #[test]
    fn the_system_disk_is_laid_out_to_its_end() {
        let parts = layout(100_000_000_000);
        assert_eq!(parts.len(), 4);
        let last = parts.last().expect("EPHEMERAL");
        assert!(last.offset + last.size <= 100_000_000_000 - 33 * 512);
        assert_eq!(partition_name("nvme0n1", 2), "nvme0n1p2");
        assert_eq!(partition_name("vda", 2), "vda2");
    }
}
