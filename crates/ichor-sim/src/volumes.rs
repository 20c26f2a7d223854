//! User volumes (`UserVolumeConfig` documents, `crates/ichor-sim/docs/user-volumes.md`): what
//! Talos's volume manager makes of them, and what it leaves on the disks.
//!
//! - The documents of the running config become volume configs
//!   (`UserVolumeTransformer`,
//!   `internal/app/machined/pkg/controllers/block/internal/volumes/volumeconfig/user_volumes.go`).
//! - [`reconcile`] is one pass of `block.VolumeManagerController`
//!   (`internal/app/machined/pkg/controllers/block/volume_manager.go`): in Talos's order of
//!   provisioning, each volume's state machine runs until it stops moving (`waiting` →
//!   `located`/`provisioned` → `prepared` → `ready`, or `failed` with the error). A `ready`
//!   volume is left alone; a failed one is tried again on the next pass; the status of a
//!   removed document is destroyed.
//! - Partitions and filesystems the volumes create are kept per disk ([`DiskContent`]): they
//!   outlive the boot and the document, and a volume finds its partition again by its label
//!   (`u-<name>`), never by the selector.
//!
//! The pass runs whenever the node's volume resources are read, so what a reader sees is what
//! the controller would have settled on by then.

use std::collections::BTreeMap;
use std::time::Duration;

use ichor_talos::api::resource::definitions::enums::{
    BlockFilesystemType, BlockVolumePhase, BlockVolumeType,
};
use serde_json::Value;

use crate::Node;
use crate::apply::cel::{self, DiskFields};
use crate::apply::disks;
use crate::hardware::SimDisk;

/// One MiB.
pub(crate) const MIB: u64 = 1024 * 1024;
/// The size a user volume gets without `minSize` (`MinUserVolumeSize`, `volumeconfig/user_volumes.go`).
const MIN_USER_VOLUME_SIZE: u64 = 100 * MIB;
/// The sector size of the simulated disks (CD-ROMs aside).
const SECTOR: u64 = 512;
/// The GPT partition type of user volumes (`partition.LinuxFilesystemData`).
pub(crate) const LINUX_DATA: &str = "0FC63DAF-8483-4772-8E79-3D69D8477DE4";
/// The id prefix of user volumes (`constants.UserVolumePrefix`).
pub(crate) const PREFIX: &str = "u-";
/// Where user volumes are mounted (`constants.UserVolumeMountPoint`).
pub(crate) const MOUNT_PARENT: &str = "/var/mnt";
/// The SELinux label of user volume mounts (`constants.EphemeralSelinuxLabel`).
pub(crate) const SELINUX_LABEL: &str = "system_u:object_r:ephemeral_t:s0";
/// The scrub interval of a per-volume `scrub` without one (`constants.DefaultFilesystemScrubInterval`).
const DEFAULT_SCRUB_INTERVAL: Duration = Duration::from_secs(7 * 24 * 3600);

/// A user volume's `volumeType` (`block.VolumeType`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A partition on a disk the selector picks (the default).
    Partition,
    /// A whole disk.
    Disk,
    /// A directory under `/var/mnt`.
    Directory,
}

impl Kind {
    /// The proto enum and the YAML text (`volumetype_enumer.go`).
    pub(crate) fn wire(self) -> (BlockVolumeType, &'static str) {
        match self {
            Self::Partition => (BlockVolumeType::VolumeTypePartition, "partition"),
            Self::Disk => (BlockVolumeType::VolumeTypeDisk, "disk"),
            Self::Directory => (BlockVolumeType::VolumeTypeDirectory, "directory"),
        }
    }
}

/// A filesystem a user volume is formatted with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Filesystem {
    /// `xfs`, the default.
    Xfs,
    /// `ext4`.
    Ext4,
    /// `btrfs` (1.14).
    Btrfs,
}

impl Filesystem {
    /// The name blkid and Talos's enum give it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Xfs => "xfs",
            Self::Ext4 => "ext4",
            Self::Btrfs => "btrfs",
        }
    }

    /// The proto enum.
    pub(crate) fn proto(self) -> BlockFilesystemType {
        match self {
            Self::Xfs => BlockFilesystemType::FilesystemTypeXfs,
            Self::Ext4 => BlockFilesystemType::FilesystemTypeExt4,
            Self::Btrfs => BlockFilesystemType::FilesystemTypeBtrfs,
        }
    }
}

/// One `UserVolumeConfig` document as the volume config controller turns it into a volume
/// config (`UserVolumeTransformer`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserVolumeConfig {
    /// The document's name.
    pub(crate) name: String,
    /// Its `volumeType`.
    pub(crate) kind: Kind,
    /// `provisioning.diskSelector.match` (CEL text; `false` when absent, Talos's `noMatch`).
    pub(crate) selector: String,
    /// `provisioning.minSize`, 100 MiB when unset.
    pub(crate) min_size: u64,
    /// An absolute `maxSize` (0: none); with `negative_max_size`, what to leave free.
    pub(crate) max_size: u64,
    /// A `maxSize` in percent of the free space (0: none).
    pub(crate) relative_max_size: u64,
    /// Whether `maxSize` is negative: the space to leave free.
    pub(crate) negative_max_size: bool,
    /// `provisioning.grow` (always for a `disk` volume).
    pub(crate) grow: bool,
    /// `filesystem.type`, xfs when unset.
    pub(crate) filesystem: Filesystem,
    /// `filesystem.projectQuotaSupport`.
    pub(crate) project_quota: bool,
    /// The resolved trim interval, when trimming is on (1.14, `volumeconfig/trim.go`).
    pub(crate) trim: Option<Duration>,
    /// The resolved scrub interval, when scrubbing is on (1.14, `volumeconfig/scrub.go`).
    pub(crate) scrub: Option<Duration>,
}

impl UserVolumeConfig {
    /// The volume's id (`u-<name>`).
    pub(crate) fn id(&self) -> String {
        format!("{PREFIX}{}", self.name)
    }

    /// Whether the volume config has provisioning instructions (directories have none).
    fn provisioned(&self) -> bool {
        self.kind != Kind::Directory
    }

    /// `PartitionSpec.ResolveMaxSize` (`pkg/machinery/resources/block/volume_config.go`).
    fn resolve_max_size(&self, available: u64) -> Result<u64, String> {
        let size = if self.relative_max_size != 0 {
            available * self.relative_max_size / 100
        } else {
            self.max_size
        };
        if self.negative_max_size {
            if size > available {
                return Err("partition size cannot be negative".into());
            }
            return Ok(available - size);
        }
        Ok(size)
    }
}

/// A size field of the document: the bytes (or percent), whether it is a percentage, whether
/// it is negative (`ByteSize`, `PercentageSize`, `pkg/machinery/config/types/block`).
fn size_of(value: &Value) -> Option<(u64, bool, bool)> {
    let text = match value {
        Value::String(s) => s.clone(),
        Value::Number(n) => n.to_string(),
        _ => return None,
    };
    if text.is_empty() {
        return None;
    }
    let (negative, rest) = match text.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, text.as_str()),
    };
    if let Some(percent) = rest.strip_suffix('%') {
        let value: f64 = percent.parse().ok()?;
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        return Some((value as u64, true, negative));
    }
    disks::parse_bytes(rest).ok().map(|v| (v, false, negative))
}

/// Go's `time.ParseDuration`, in nanoseconds.
pub(crate) fn parse_go_duration(text: &str) -> Option<i128> {
    let (sign, mut rest) = match text.as_bytes().first() {
        Some(b'-') => (-1, &text[1..]),
        Some(b'+') => (1, &text[1..]),
        _ => (1, text),
    };
    if rest == "0" {
        return Some(0);
    }
    if rest.is_empty() {
        return None;
    }
    let mut total: f64 = 0.0;
    while !rest.is_empty() {
        let number_end = rest
            .find(|c: char| !(c.is_ascii_digit() || c == '.'))
            .unwrap_or(rest.len());
        let number = &rest[..number_end];
        if number.is_empty() || number == "." {
            return None;
        }
        let value: f64 = number.parse().ok()?;
        rest = &rest[number_end..];
        let unit_end = rest
            .find(|c: char| c.is_ascii_digit() || c == '.')
            .unwrap_or(rest.len());
        let scale: f64 = match &rest[..unit_end] {
            "ns" => 1.0,
            "us" | "µs" | "μs" => 1e3,
            "ms" => 1e6,
            "s" => 1e9,
            "m" => 60e9,
            "h" => 3600e9,
            _ => return None,
        };
        total += value * scale;
        rest = &rest[unit_end..];
    }
    // Go refuses a duration past 2^63-1 ns ("invalid duration"); the check also keeps an
    // infinite sum of huge numbers from reaching the cast.
    if !total.is_finite() || total.round() > i64::MAX as f64 {
        return None;
    }
    #[allow(clippy::cast_possible_truncation)]
    Some(sign * total.round() as i128)
}

/// A non-negative Go duration as a [`Duration`].
fn duration_of(value: &Value) -> Option<Duration> {
    let nanos = parse_go_duration(value.as_str()?)?;
    u64::try_from(nanos).ok().map(Duration::from_nanos)
}

/// Go's `time.Duration.String()`.
pub(crate) fn go_duration(d: Duration) -> String {
    let nanos = d.as_nanos();
    if nanos == 0 {
        return "0s".into();
    }
    let fraction = |value: u128, digits: u32| {
        let scale = 10u128.pow(digits);
        let (whole, frac) = (value / scale, value % scale);
        if frac == 0 {
            whole.to_string()
        } else {
            let text = format!("{frac:0width$}", width = digits as usize);
            format!("{whole}.{}", text.trim_end_matches('0'))
        }
    };
    if nanos < 1_000 {
        return format!("{nanos}ns");
    }
    if nanos < 1_000_000 {
        return format!("{}µs", fraction(nanos, 3));
    }
    if nanos < 1_000_000_000 {
        return format!("{}ms", fraction(nanos, 6));
    }
    let seconds = nanos % 60_000_000_000;
    let minutes = nanos / 60_000_000_000 % 60;
    let hours = nanos / 3_600_000_000_000;
    let s = format!("{}s", fraction(seconds, 9));
    match (hours, minutes) {
        (0, 0) => s,
        (0, m) => format!("{m}m{s}"),
        (h, m) => format!("{h}h{m}m{s}"),
    }
}

/// The user volume configs of a config's documents, as Talos reads them (`v14`: the 1.14
/// fields, trim and scrub, count).
pub(crate) fn configs(documents: &[Value], v14: bool) -> Vec<UserVolumeConfig> {
    let global = |kind: &str| {
        documents
            .iter()
            .find(|d| d["kind"] == kind)
            .and_then(|d| duration_of(&d["interval"]))
            .filter(|d| !d.is_zero())
    };
    let global_trim = global("FilesystemTrimConfig");
    let global_scrub = global("FilesystemScrubConfig");
    let mut out: Vec<UserVolumeConfig> = Vec::new();
    for d in documents.iter().filter(|d| d["kind"] == "UserVolumeConfig") {
        let name = d["name"].as_str().unwrap_or_default().to_owned();
        if out.iter().any(|c| c.name == name) {
            continue;
        }
        let kind = match d["volumeType"].as_str().map(str::to_lowercase).as_deref() {
            Some("disk") => Kind::Disk,
            Some("directory") => Kind::Directory,
            _ => Kind::Partition,
        };
        let provisioning = &d["provisioning"];
        let selector = provisioning["diskSelector"]["match"]
            .as_str()
            .filter(|s| !s.is_empty())
            .unwrap_or("false")
            .to_owned();
        let min = size_of(&provisioning["minSize"]).filter(|(_, percent, _)| !percent);
        let max = size_of(&provisioning["maxSize"]);
        let filesystem = match d["filesystem"]["type"]
            .as_str()
            .map(str::to_lowercase)
            .as_deref()
        {
            Some("ext4") => Filesystem::Ext4,
            Some("btrfs") => Filesystem::Btrfs,
            _ => Filesystem::Xfs,
        };
        // ResolveTrim / ResolveScrub: the global interval, overridden by the volume's section.
        let resolve = |section: &Value, global: Option<Duration>, default: Option<Duration>| {
            let mut enabled = global.is_some();
            let mut interval = global;
            if section.is_object() {
                enabled = section["enabled"].as_bool().unwrap_or(true);
                if let Some(own) = duration_of(&section["interval"]).filter(|d| !d.is_zero()) {
                    interval = Some(own);
                } else if interval.is_none() {
                    interval = default;
                }
            }
            interval.filter(|_| enabled && v14)
        };
        let (trim, scrub) = if kind == Kind::Directory {
            (None, None)
        } else {
            (
                resolve(&d["trim"], global_trim, None),
                resolve(&d["scrub"], global_scrub, Some(DEFAULT_SCRUB_INTERVAL)),
            )
        };
        out.push(UserVolumeConfig {
            name,
            kind,
            selector,
            min_size: min
                .map(|(v, _, _)| v)
                .filter(|v| *v != 0)
                .unwrap_or(MIN_USER_VOLUME_SIZE),
            max_size: max.filter(|(_, percent, _)| !percent).map_or(0, |m| m.0),
            relative_max_size: max.filter(|(_, percent, _)| *percent).map_or(0, |m| m.0),
            negative_max_size: max.is_some_and(|(_, _, negative)| negative),
            grow: provisioning["grow"].as_bool().unwrap_or(false) || kind == Kind::Disk,
            filesystem,
            project_quota: d["filesystem"]["projectQuotaSupport"].as_bool() == Some(true),
            trim,
            scrub,
        });
    }
    out
}

/// `CompareVolumeConfigs` (`internal/volumes/volumes.go`): volumes without provisioning first,
/// then (all user volumes are one wave) the ones that do not grow, smaller `maxSize` first,
/// then by id.
fn provisioning_order(a: &UserVolumeConfig, b: &UserVolumeConfig) -> std::cmp::Ordering {
    let max = |c: &UserVolumeConfig| {
        if c.kind == Kind::Partition && c.max_size != 0 {
            c.max_size
        } else {
            u64::MAX
        }
    };
    a.provisioned()
        .cmp(&b.provisioned())
        .then(a.grow.cmp(&b.grow))
        .then(max(a).cmp(&max(b)))
        .then(a.id().cmp(&b.id()))
}

/// A filesystem written on a partition or a disk, and its UUID.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Formatted {
    /// The filesystem.
    pub(crate) filesystem: Filesystem,
    /// Its UUID.
    pub(crate) uuid: String,
}

/// A partition a user volume created.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct UserPartition {
    /// Its number (1-based).
    pub(crate) index: u64,
    /// Its first sector.
    pub(crate) first_lba: u64,
    /// Its last sector.
    pub(crate) last_lba: u64,
    /// The partition label, `u-<name>`.
    pub(crate) label: String,
    /// Its GPT partition GUID.
    pub(crate) partition_uuid: String,
    /// The filesystem on it, once formatted.
    pub(crate) formatted: Option<Formatted>,
}

impl UserPartition {
    /// Its size in bytes.
    pub(crate) fn size(&self) -> u64 {
        (self.last_lba + 1 - self.first_lba) * SECTOR
    }
}

/// What user volumes wrote on a disk.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum DiskContent {
    /// A GPT holding user-volume partitions.
    Gpt(Vec<UserPartition>),
    /// A filesystem on the whole disk (a `disk` volume).
    Whole(Formatted),
}

/// A user volume's status (`VolumeStatusSpec`, `pkg/machinery/resources/block/volume_status.go`):
/// what the node serves as `VolumeStatuses.block.talos.dev/u-<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Status {
    /// `phase`.
    pub(crate) phase: BlockVolumePhase,
    /// The phase the last error happened in (`waiting`, the zero value, when none).
    pub(crate) pre_fail_phase: BlockVolumePhase,
    /// `type`.
    pub(crate) kind: Kind,
    /// `location`: the partition, or the disk.
    pub(crate) location: String,
    /// `mountLocation`.
    pub(crate) mount_location: String,
    /// `partitionIndex`.
    pub(crate) partition_index: u64,
    /// `parentLocation`: the partition's disk.
    pub(crate) parent_location: String,
    /// `uuid`: the filesystem's, once located.
    pub(crate) uuid: String,
    /// `partitionUUID`.
    pub(crate) partition_uuid: String,
    /// `size` in bytes.
    pub(crate) size: u64,
    /// `filesystem`, once ready.
    pub(crate) filesystem: Option<Filesystem>,
    /// The mount spec, copied from the volume config at the first locate attempt:
    /// `projectQuotaSupport`, and whether it is a bind mount (directories).
    pub(crate) mount: Option<(bool, bool)>,
    /// `trimInterval` when `trimEnabled` (1.14).
    pub(crate) trim: Option<Duration>,
    /// `scrubInterval` when `scrubEnabled` (1.14).
    pub(crate) scrub: Option<Duration>,
    /// `errorMessage`.
    pub(crate) error: String,
}

impl Status {
    fn new(kind: Kind) -> Self {
        Self {
            phase: BlockVolumePhase::VolumePhaseWaiting,
            pre_fail_phase: BlockVolumePhase::VolumePhaseWaiting,
            kind,
            location: String::new(),
            mount_location: String::new(),
            partition_index: 0,
            parent_location: String::new(),
            uuid: String::new(),
            partition_uuid: String::new(),
            size: 0,
            filesystem: None,
            mount: None,
            trim: None,
            scrub: None,
            error: String::new(),
        }
    }
}

/// A UUID derived from a seed (lowercase, 8-4-4-4-12): what a real disk gets at random stays
/// the same for a machine here.
pub(crate) fn derived_uuid(seed: &str) -> String {
    let mut state = seed.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    });
    let mut next = || {
        state = state.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = state;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    };
    let hex = format!("{:016x}{:016x}", next(), next());
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// The partition device name (`partitioning.DevName`: `vdb1`, `nvme0n1p1`).
pub(crate) fn partition_name(disk: &str, index: u64) -> String {
    if disk.ends_with(|c: char| c.is_ascii_digit()) {
        format!("{disk}p{index}")
    } else {
        format!("{disk}{index}")
    }
}

/// A GPT's used LBA ranges, and the disk's last LBA: where free space is
/// (`gpt.Table.allocatableRanges`, go-blockdevice v2 `partitioning/gpt/gpt.go`).
struct Table {
    last_lba: u64,
    /// (first, last) LBA of each partition, sorted.
    used: Vec<(u64, u64)>,
}

/// One free, 1 MiB-aligned range: first LBA and size in bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Range {
    low: u64,
    size: u64,
}

impl Table {
    fn new(disk_size: u64, mut used: Vec<(u64, u64)>) -> Self {
        used.sort_unstable();
        Self {
            last_lba: (disk_size / SECTOR).saturating_sub(1),
            used,
        }
    }

    /// The free ranges: the first usable LBA is 34 aligned to 2048 (1 MiB), the last usable
    /// one is 33 before the end, and each range starts aligned; the last one also ends aligned.
    fn ranges(&self) -> Vec<Range> {
        const ALIGN: u64 = MIB / SECTOR;
        let last_usable = self.last_lba.saturating_sub(33);
        let mut low = 34u64;
        let mut out = Vec::new();
        let mut i = 0;
        loop {
            let high = match self.used.get(i) {
                Some((first, _)) => first.saturating_sub(1),
                None => (last_usable / ALIGN * ALIGN).saturating_sub(1),
            };
            low = low.div_ceil(ALIGN) * ALIGN;
            if high > low {
                out.push(Range {
                    low,
                    size: (high - low + 1) * SECTOR,
                });
            }
            let Some((_, last)) = self.used.get(i) else {
                break;
            };
            low = last + 1;
            i += 1;
        }
        out
    }

    /// `LargestContiguousAllocatable`.
    fn largest(&self) -> u64 {
        self.ranges().iter().map(|r| r.size).max().unwrap_or(0)
    }

    /// `AllocatePartition`: the smallest range that fits; the partition's first and last LBA.
    fn allocate(&self, size: u64) -> Option<(u64, u64)> {
        let range = self
            .ranges()
            .into_iter()
            .filter(|r| r.size >= size)
            .min_by_key(|r| r.size)?;
        Some((range.low, range.low + size / SECTOR - 1))
    }
}

/// The system disk's partitions (EFI, META, STATE, EPHEMERAL) as LBA ranges.
fn system_partitions(node: &Node, disk: &SimDisk) -> Vec<(u64, u64)> {
    if !is_system_disk(node, disk) {
        return Vec::new();
    }
    crate::cosi::system_layout(disk.size)
        .into_iter()
        .map(|(offset, size)| (offset / SECTOR, (offset + size) / SECTOR - 1))
        .collect()
}

/// Whether `disk` is the installed system disk.
pub(crate) fn is_system_disk(node: &Node, disk: &SimDisk) -> bool {
    node.installed
        && node
            .hardware
            .install_disk()
            .is_some_and(|d| d.name == disk.name)
}

/// What probing a disk finds (`blkid.ProbePath`): its content's name (`""`, `gpt`,
/// `iso9660`, a filesystem), and, for a GPT, the table.
fn probe(node: &Node, disk: &SimDisk) -> (&'static str, Option<Table>) {
    if disk.cdrom {
        return ("iso9660", None);
    }
    let system = system_partitions(node, disk);
    match node.disk_content.get(&disk.name) {
        Some(DiskContent::Whole(f)) => (f.filesystem.name(), None),
        Some(DiskContent::Gpt(parts)) => {
            let mut used = system;
            used.extend(parts.iter().map(|p| (p.first_lba, p.last_lba)));
            ("gpt", Some(Table::new(disk.size, used)))
        }
        None if !system.is_empty() => ("gpt", Some(Table::new(disk.size, system))),
        None => ("", None),
    }
}

/// Why a disk cannot take a volume (`DiskRejectedReason`, `internal/volumes/disk.go`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Rejected {
    NotEnoughSpace,
    WrongFormat,
}

/// `CheckDiskForProvisioning`: whether the disk can take the volume, and whether it has a GPT.
fn check_disk(node: &Node, disk: &SimDisk, config: &UserVolumeConfig) -> Result<bool, Rejected> {
    let (name, table) = probe(node, disk);
    match config.kind {
        Kind::Disk if name.is_empty() => Ok(false),
        Kind::Disk => Err(Rejected::WrongFormat),
        _ if name.is_empty() => {
            // GPT and MBR: 67 sectors.
            if disk.size >= config.min_size + SECTOR * 67 {
                Ok(false)
            } else {
                Err(Rejected::NotEnoughSpace)
            }
        }
        _ => match table {
            Some(table) if table.largest() >= config.min_size => Ok(true),
            Some(_) => Err(Rejected::NotEnoughSpace),
            None => Err(Rejected::WrongFormat),
        },
    }
}

/// The attached disks as the volume manager sees them (sorted by id), each with
/// `system_disk` set.
fn disk_contexts(node: &Node) -> Vec<(SimDisk, DiskFields)> {
    let mut sorted: Vec<SimDisk> = node.hardware.disks.clone();
    sorted.sort_by(|a, b| a.name.cmp(&b.name));
    let fields = disks::disk_fields(&sorted);
    sorted
        .into_iter()
        .zip(fields)
        .map(|(disk, mut f)| {
            f.system_disk = is_system_disk(node, &disk);
            (disk, f)
        })
        .collect()
}

/// The disks the selector matches (`findCandidateDisks`; the simulated disks are writable).
fn matching_disks(
    node: &Node,
    config: &UserVolumeConfig,
) -> Result<Vec<(SimDisk, DiskFields)>, String> {
    let selector = cel::parse_bool(&config.selector)
        .map_err(|e| format!("error evaluating disk locator: {e}"))?;
    let mut out = Vec::new();
    for (disk, fields) in disk_contexts(node) {
        if selector
            .matches(&fields)
            .map_err(|e| format!("error evaluating disk locator: {e}"))?
        {
            out.push((disk, fields));
        }
    }
    Ok(out)
}

/// Whether the volumes of earlier waves (EPHEMERAL, wave -1) are ready: in the simulator, once
/// Talos is installed on an attached system disk (as `cosi::block` reports EPHEMERAL).
fn earlier_waves_ready(node: &Node) -> bool {
    node.installed && node.hardware.install_disk().is_some()
}

/// The config the volume config controller reads: the running one (or, between boots, the
/// one on disk).
fn active_documents(node: &Node) -> Option<std::sync::Arc<Vec<Value>>> {
    let config = node.running.as_ref().or(node.persisted.as_ref())?;
    Some(std::sync::Arc::clone(&config.documents))
}

/// One pass of the volume manager over the user volumes of the active config.
pub(crate) fn reconcile(node: &mut Node) {
    let Some(documents) = active_documents(node) else {
        node.user_volumes.clear();
        return;
    };
    let mut wanted = configs(&documents, node.shared.is_1_14());
    wanted.sort_by(provisioning_order);
    // A removed document: its volume is closed and its status destroyed (the partition stays).
    node.user_volumes
        .retain(|id, _| wanted.iter().any(|c| c.id() == *id));
    // `fullyProvisionedWave`: a volume with provisioning that is not ready holds back the
    // provisioning (not the locating) of every volume after it.
    let mut previous_ready = earlier_waves_ready(node);
    for config in &wanted {
        let id = config.id();
        let mut status = node
            .user_volumes
            .remove(&id)
            .unwrap_or_else(|| Status::new(config.kind));
        status.trim = config.trim;
        status.scrub = config.scrub;
        let result = process(node, config, &mut status, previous_ready);
        match result {
            Ok(()) => {
                status.error.clear();
                status.pre_fail_phase = BlockVolumePhase::VolumePhaseWaiting;
            }
            Err(error) => {
                status.pre_fail_phase = status.phase;
                status.phase = BlockVolumePhase::VolumePhaseFailed;
                status.error = error;
            }
        }
        if status.phase != BlockVolumePhase::VolumePhaseReady && config.provisioned() {
            previous_ready = false;
        }
        node.user_volumes.insert(id, status);
    }
}

/// `processVolumeConfig`: the state machine, until it stops moving.
fn process(
    node: &mut Node,
    config: &UserVolumeConfig,
    status: &mut Status,
    previous_ready: bool,
) -> Result<(), String> {
    loop {
        let before = status.phase;
        match status.phase {
            BlockVolumePhase::VolumePhaseReady | BlockVolumePhase::VolumePhaseClosed => {
                return Ok(());
            }
            BlockVolumePhase::VolumePhaseWaiting | BlockVolumePhase::VolumePhaseMissing => {
                locate_and_provision(node, config, status, previous_ready)?;
            }
            // Growing is not simulated: a located partition keeps its size.
            BlockVolumePhase::VolumePhaseLocated => {
                status.phase = BlockVolumePhase::VolumePhaseProvisioned;
            }
            // No encryption: the volume is mounted from where it is (`HandleEncryption`).
            BlockVolumePhase::VolumePhaseProvisioned => {
                status.phase = BlockVolumePhase::VolumePhasePrepared;
                status.mount_location.clone_from(&status.location);
            }
            BlockVolumePhase::VolumePhasePrepared => format(node, config, status)?,
            BlockVolumePhase::VolumePhaseFailed => status.phase = status.pre_fail_phase,
        }
        if status.phase == before {
            return Ok(());
        }
    }
}

/// `LocateAndProvision` (`internal/volumes/locate.go`).
fn locate_and_provision(
    node: &mut Node,
    config: &UserVolumeConfig,
    status: &mut Status,
    previous_ready: bool,
) -> Result<(), String> {
    status.mount = Some((config.project_quota, config.kind == Kind::Directory));
    match config.kind {
        Kind::Directory => {
            status.phase = BlockVolumePhase::VolumePhaseReady;
            return Ok(());
        }
        Kind::Disk => {
            // `locateDiskByDiskMatch`: one matching disk is located (its whole-disk volume).
            let matched = matching_disks(node, config)?;
            if matched.len() > 1 {
                let paths: Vec<String> = matched.iter().map(|(_, f)| f.dev_path.clone()).collect();
                return Err(format!(
                    "multiple disks matched locator for disk volume; matched disks: [{}]",
                    paths.join(" ")
                ));
            }
            if let Some((disk, fields)) = matched.first() {
                status.phase = BlockVolumePhase::VolumePhaseLocated;
                status.location.clone_from(&fields.dev_path);
                status.partition_index = 0;
                status.parent_location.clear();
                status.uuid = whole_disk_uuid(node, disk);
                status.partition_uuid.clear();
                status.size = disk.size;
                return Ok(());
            }
        }
        Kind::Partition => {
            // `locateVolumeByMatch`: the partition labelled `u-<name>`.
            if let Some((disk, p)) = labelled_partition(node, &config.id()) {
                status.phase = BlockVolumePhase::VolumePhaseLocated;
                status.location = format!("/dev/{}", partition_name(&disk, p.index));
                status.partition_index = p.index;
                status.parent_location = format!("/dev/{disk}");
                status.uuid = p
                    .formatted
                    .as_ref()
                    .map(|f| f.uuid.clone())
                    .unwrap_or_default();
                status.partition_uuid.clone_from(&p.partition_uuid);
                status.size = p.size();
                return Ok(());
            }
        }
    }
    if !previous_ready {
        status.phase = BlockVolumePhase::VolumePhaseWaiting;
        return Ok(());
    }
    provision(node, config, status)
}

/// The partition labelled `label` on an attached disk, and the disk's name.
fn labelled_partition(node: &Node, label: &str) -> Option<(String, UserPartition)> {
    let mut disks: Vec<&SimDisk> = node.hardware.disks.iter().collect();
    disks.sort_by(|a, b| a.name.cmp(&b.name));
    disks
        .into_iter()
        .find_map(|d| match node.disk_content.get(&d.name) {
            Some(DiskContent::Gpt(parts)) => parts
                .iter()
                .find(|p| p.label == label)
                .map(|p| (d.name.clone(), p.clone())),
            _ => None,
        })
}

/// The UUID probing a whole disk finds: its filesystem's, or its GPT's.
fn whole_disk_uuid(node: &Node, disk: &SimDisk) -> String {
    match node.disk_content.get(&disk.name) {
        Some(DiskContent::Whole(f)) => f.uuid.clone(),
        Some(DiskContent::Gpt(_)) => gpt_uuid(node, &disk.name),
        None if is_system_disk(node, disk) => gpt_uuid(node, &disk.name),
        None => String::new(),
    }
}

/// The disk GUID of a GPT the simulator wrote.
pub(crate) fn gpt_uuid(node: &Node, disk: &str) -> String {
    if node.hardware.install_disk().is_some_and(|d| d.name == disk) {
        // The system disk's, as `cosi::block` reports it.
        return derived_uuid(&format!("{}/gpt", node.hardware.uuid));
    }
    derived_uuid(&format!("{}/gpt/{disk}", node.hardware.uuid))
}

/// `provisionNewVolume`: the first disk the selector matches that has room
/// (`findCandidateDisks`, `selectBestDisk`), and the partition created there
/// (`CreatePartition`, `internal/volumes/partition.go`).
fn provision(
    node: &mut Node,
    config: &UserVolumeConfig,
    status: &mut Status,
) -> Result<(), String> {
    let candidates = matching_disks(node, config)?;
    if candidates.is_empty() {
        return Err("no disks matched selector for volume".into());
    }
    if config.kind == Kind::Disk && candidates.len() > 1 {
        let paths: Vec<String> = candidates.iter().map(|(_, f)| f.dev_path.clone()).collect();
        return Err(format!(
            "multiple disks matched locator for disk volume; matched disks: [{}]",
            paths.join(" ")
        ));
    }
    let (mut space, mut format) = (0, 0);
    let mut picked = None;
    for (disk, _) in &candidates {
        match check_disk(node, disk, config) {
            Ok(has_gpt) => {
                picked = Some((disk.clone(), has_gpt));
                break;
            }
            Err(Rejected::NotEnoughSpace) => space += 1,
            Err(Rejected::WrongFormat) => format += 1,
        }
    }
    let Some((disk, has_gpt)) = picked else {
        return Err(format!(
            "no disks matched for volume ({} matched selector): {space} have not enough space, {format} have wrong format, 0 have other issues",
            candidates.len()
        ));
    };
    if config.kind == Kind::Disk {
        status.phase = BlockVolumePhase::VolumePhaseProvisioned;
        status.location = format!("/dev/{}", disk.name);
        status.parent_location.clear();
        status.size = disk.size;
        return Ok(());
    }
    let table = if has_gpt {
        probe(node, &disk)
            .1
            .unwrap_or_else(|| Table::new(disk.size, Vec::new()))
    } else {
        Table::new(disk.size, Vec::new())
    };
    let available = table.largest();
    let max = config
        .resolve_max_size(available)
        .map_err(|e| format!("error creating partition: error resolving max size: {e}"))?;
    if available < config.min_size {
        return Err("error creating partition: not enough space on disk".into());
    }
    let size = if max == 0 || max >= available {
        available
    } else {
        max
    };
    let (first_lba, last_lba) = table.allocate(size).filter(|_| size >= SECTOR).ok_or(
        "error creating partition: error allocating partition: no allocatable range found",
    )?;
    let system_partitions = if is_system_disk(node, &disk) { 4 } else { 0 };
    let index = match node.disk_content.get(&disk.name) {
        Some(DiskContent::Gpt(parts)) => parts.iter().map(|p| p.index).max(),
        _ => None,
    }
    .unwrap_or(system_partitions)
        + 1;
    let label = config.id();
    let partition_uuid = derived_uuid(&format!(
        "{}/partition/{}/{label}/{index}",
        node.hardware.uuid, disk.name
    ));
    let content = node
        .disk_content
        .entry(disk.name.clone())
        .or_insert_with(|| DiskContent::Gpt(Vec::new()));
    let DiskContent::Gpt(parts) = content else {
        return Err("error creating partition: error initializing GPT: not a GPT".into());
    };
    parts.push(UserPartition {
        index,
        first_lba,
        last_lba,
        label,
        partition_uuid: partition_uuid.clone(),
        formatted: None,
    });
    status.phase = BlockVolumePhase::VolumePhaseProvisioned;
    status.location = format!("/dev/{}", partition_name(&disk.name, index));
    status.partition_index = index;
    status.parent_location = format!("/dev/{}", disk.name);
    status.partition_uuid = partition_uuid;
    status.size = size;
    Ok(())
}

/// `Format` (`internal/volumes/format.go`): a filesystem that is there must be the configured
/// one; none is made.
fn format(node: &mut Node, config: &UserVolumeConfig, status: &mut Status) -> Result<(), String> {
    let device = status.mount_location.trim_start_matches("/dev/").to_owned();
    let seed = format!("{}/fs/{}/{device}", node.hardware.uuid, config.id());
    let want = config.filesystem;
    let existing: Option<Option<Formatted>> = match config.kind {
        Kind::Disk => {
            let cdrom = node
                .hardware
                .disks
                .iter()
                .any(|d| d.name == device && d.cdrom);
            if cdrom {
                return Err(format!(
                    "filesystem type mismatch: iso9660 != {}",
                    want.name()
                ));
            }
            match node.disk_content.get(&device) {
                Some(DiskContent::Whole(f)) => Some(Some(f.clone())),
                Some(DiskContent::Gpt(_)) => {
                    return Err(format!("filesystem type mismatch: gpt != {}", want.name()));
                }
                None if node
                    .hardware
                    .disks
                    .iter()
                    .any(|d| d.name == device && is_system_disk(node, d)) =>
                {
                    return Err(format!("filesystem type mismatch: gpt != {}", want.name()));
                }
                None => Some(None),
            }
        }
        _ => labelled_partition(node, &config.id()).map(|(_, p)| p.formatted),
    };
    match existing {
        Some(Some(f)) if f.filesystem != want => {
            return Err(format!(
                "filesystem type mismatch: {} != {}",
                f.filesystem.name(),
                want.name()
            ));
        }
        Some(Some(_)) => {}
        Some(None) => {
            let formatted = Formatted {
                filesystem: want,
                uuid: derived_uuid(&seed),
            };
            match config.kind {
                Kind::Disk => {
                    node.disk_content
                        .insert(device, DiskContent::Whole(formatted));
                }
                _ => {
                    let label = config.id();
                    for content in node.disk_content.values_mut() {
                        if let DiskContent::Gpt(parts) = content
                            && let Some(p) = parts.iter_mut().find(|p| p.label == label)
                        {
                            p.formatted = Some(formatted.clone());
                        }
                    }
                }
            }
        }
        None => {
            return Err(format!(
                "error probing disk: no such device {}",
                status.mount_location
            ));
        }
    }
    status.phase = BlockVolumePhase::VolumePhaseReady;
    status.filesystem = Some(want);
    Ok(())
}

/// A wipe of `disk` (a reset's user disk, `BlockDeviceWipe`): what user volumes wrote there is
/// gone.
pub(crate) fn wipe(node: &mut Node, disk: &str) {
    node.disk_content.remove(disk);
}

/// The user volume a wipe of `disk` would pull away from under it, if any
/// (`storaged/server.go`: a volume located on the disk or one of its partitions).
pub(crate) fn in_use(node: &mut Node, disk: &str) -> Option<String> {
    reconcile(node);
    let on = |path: &str| {
        let base = path.rsplit('/').next().unwrap_or_default();
        !base.is_empty() && base == disk
    };
    node.user_volumes
        .iter()
        .find(|(_, s)| on(&s.location) || on(&s.mount_location) || on(&s.parent_location))
        .map(|(id, _)| id.clone())
}

/// The partitions and whole-disk filesystems on an attached disk, for its discovered volumes.
pub(crate) fn content(node: &Node, disk: &str) -> Option<DiskContent> {
    node.disk_content.get(disk).cloned()
}

/// The user volume statuses of this boot, by id.
pub(crate) fn statuses(node: &Node) -> &BTreeMap<String, Status> {
    &node.user_volumes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations_round_trip() {
        for (text, secs) in [("168h0m0s", 7 * 24 * 3600), ("1m30s", 90), ("10s", 10)] {
            let nanos = parse_go_duration(text).expect("parses");
            assert_eq!(nanos, i128::from(secs) * 1_000_000_000);
            assert_eq!(go_duration(Duration::from_secs(secs)), text);
        }
        assert_eq!(parse_go_duration("1.5h"), Some(5400 * 1_000_000_000));
        assert_eq!(parse_go_duration("-1s"), Some(-1_000_000_000));
        assert_eq!(parse_go_duration("bogus"), None);
        // Past Go's range: refused, as time.ParseDuration refuses it, never wrapped.
        assert_eq!(parse_go_duration("2562048h"), None);
        assert_eq!(parse_go_duration("-2562048h"), None);
        assert_eq!(parse_go_duration(&("9".repeat(400) + "h")), None);
        assert_eq!(
            parse_go_duration("2562047h"),
            Some(2_562_047 * 3_600_000_000_000)
        );
        assert_eq!(go_duration(Duration::from_millis(1500)), "1.5s");
        assert_eq!(go_duration(Duration::from_millis(250)), "250ms");
    }

    #[test]
    fn a_new_gpt_leaves_one_aligned_range() {
        let table = Table::new(50_000_000_000, Vec::new());
        let ranges = table.ranges();
        assert_eq!(ranges.len(), 1);
        assert_eq!(ranges[0].low, 2048);
        // 50 GB: last LBA 97656249, last usable 97656216, aligned down to 97654784: the
        // range ends at 97654783.
        assert_eq!(ranges[0].size, (97_654_783 - 2048 + 1) * SECTOR);
        let (first, last) = table.allocate(10 * 1024 * MIB).expect("room");
        assert_eq!(first, 2048);
        assert_eq!((last + 1 - first) * SECTOR, 10 * 1024 * MIB);
        let second = Table::new(50_000_000_000, vec![(first, last)]);
        assert_eq!(second.ranges()[0].low, last + 1);
    }

    #[test]
    fn documents_read_as_talos_reads_them() {
        let docs: Vec<Value> = serde_saphyr::from_multiple(
            "apiVersion: v1alpha1\nkind: FilesystemTrimConfig\ninterval: 168h0m0s\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == '/dev/vdb'\n  minSize: 1GiB\n  maxSize: 50%\nfilesystem:\n  type: ext4\nscrub: {}\n",
        )
        .expect("yaml");
        let c = &configs(&docs, true)[0];
        assert_eq!(c.id(), "u-data");
        assert_eq!(c.kind, Kind::Partition);
        assert_eq!(c.min_size, 1024 * MIB);
        assert_eq!((c.max_size, c.relative_max_size), (0, 50));
        assert_eq!(c.filesystem, Filesystem::Ext4);
        assert_eq!(c.trim, Some(Duration::from_secs(7 * 24 * 3600)));
        assert_eq!(c.scrub, Some(DEFAULT_SCRUB_INTERVAL));
        let c13 = &configs(&docs, false)[0];
        assert_eq!((c13.trim, c13.scrub), (None, None));
    }

    #[test]
    fn max_sizes_resolve_as_talos_resolves_them() {
        let docs: Vec<Value> = serde_saphyr::from_multiple(
            "apiVersion: v1alpha1\nkind: UserVolumeConfig\nname: a\nprovisioning:\n  maxSize: -10GB\n",
        )
        .expect("yaml");
        let c = &configs(&docs, true)[0];
        assert_eq!(c.min_size, MIN_USER_VOLUME_SIZE);
        assert_eq!(c.resolve_max_size(50_000_000_000), Ok(40_000_000_000));
        assert!(c.resolve_max_size(1_000).is_err());
        assert_eq!(c.selector, "false");
    }
}
