//! Etcd backups to object storage, the pure part: where a backup goes (its object key, which
//! says whose it is and when it was taken), which objects are Ichor's backups of a cluster
//! and none other's, which of them retention deletes, and when the next one is due. The
//! controller that streams snapshots to the store builds on these; nothing here does I/O.

use std::time::Duration;

use ichor_api::backup::{BackupRecord, BackupSpec};
use ichor_api::common::Role;
use ichor_api::names::{conditions, reasons};
use ichor_api::{TalosCluster, TalosMachine};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;

use super::Trigger;
use crate::backup_store::seal::Sealer;
use crate::{Stop, infra::conditions as cond};

/// The suffix of a backup object: an etcd snapshot file as `talosctl etcd snapshot` saves it.
pub const SNAPSHOT_SUFFIX: &str = ".snapshot";
/// Appended to [`SNAPSHOT_SUFFIX`] when the snapshot is encrypted with `age`.
pub const ENCRYPTED_SUFFIX: &str = ".age";

/// Whose backups: a cluster, by namespace, name and uid (a cluster of the same name created
/// again is another cluster, whose backups are kept apart).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Owner<'a> {
    /// The bucket prefix the backups go under (may be empty).
    pub prefix: &'a str,
    /// The TalosCluster's namespace.
    pub namespace: &'a str,
    /// The TalosCluster's name.
    pub name: &'a str,
    /// The TalosCluster's uid.
    pub uid: &'a str,
}

impl Owner<'_> {
    /// The folder every backup of this cluster goes in: `<prefix>/<namespace>/<name>/<uid>/`.
    pub fn folder(&self) -> String {
        let prefix = self.prefix.trim_matches('/');
        let base = format!("{}/{}/{}/", self.namespace, self.name, self.uid);
        if prefix.is_empty() {
            base
        } else {
            format!("{prefix}/{base}")
        }
    }

    /// The key of backup `id` taken at `at`: the folder, the time in UTC to the millisecond
    /// (`20261204T031500.123Z`, so keys sort by time), then the backup's id
    /// (`-1a2b3c4d`), so that two backups in one millisecond still get two keys (ADR 0050).
    pub fn key(&self, at: Timestamp, id: &BackupId, encrypted: bool) -> String {
        let time = at.strftime(KEY_TIME);
        let suffix = if encrypted {
            format!("{SNAPSHOT_SUFFIX}{ENCRYPTED_SUFFIX}")
        } else {
            SNAPSHOT_SUFFIX.to_owned()
        };
        format!("{}{time}-{}{suffix}", self.folder(), id.0)
    }

    /// When the backup at `key` was taken, if `key` is one of this cluster's backups: in its
    /// folder, named as [`key`](Self::key) names them, or as keys were named before ADR 0050
    /// (`20261204T031500Z.snapshot`, to the second). Anything else in the bucket is not
    /// Ichor's to touch.
    pub fn taken_at(&self, key: &str) -> Option<Timestamp> {
        let name = key.strip_prefix(&self.folder())?;
        let stem = name
            .strip_suffix(ENCRYPTED_SUFFIX)
            .unwrap_or(name)
            .strip_suffix(SNAPSHOT_SUFFIX)?;
        let (time, format, length) = match stem.split_once('-') {
            Some((time, id)) if id.len() == ID_DIGITS && is_lower_hex(id) => (time, KEY_TIME, 20),
            Some(_) => return None,
            None => (stem, LEGACY_KEY_TIME, 16),
        };
        if time.len() != length || !time.is_ascii() {
            return None;
        }
        k8s_openapi::jiff::civil::DateTime::strptime(format, time)
            .ok()?
            .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
    }
}

/// How a key names its time (UTC, to the millisecond).
const KEY_TIME: &str = "%Y%m%dT%H%M%S%.3fZ";
/// How keys named their time before ADR 0050 (UTC, to the second).
const LEGACY_KEY_TIME: &str = "%Y%m%dT%H%M%SZ";
/// The hex digits of a [`BackupId`].
const ID_DIGITS: usize = 8;

fn is_lower_hex(text: &str) -> bool {
    text.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

/// What tells a backup's key apart from any other taken in the same millisecond: 8 hex
/// digits, random for each backup.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupId(String);

impl BackupId {
    /// A fresh id from the system's random source.
    pub fn random() -> Self {
        use ring::rand::SecureRandom as _;
        let mut bytes = [0u8; 4];
        if ring::rand::SystemRandom::new().fill(&mut bytes).is_err() {
            // No random source: a counter and the clock's nanoseconds still differ per backup
            // of this process.
            static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
            let count = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            let nanos = Timestamp::now().subsec_nanosecond().unsigned_abs();
            bytes = (count.rotate_left(16) ^ nanos).to_be_bytes();
        }
        Self::from_u32(u32::from_be_bytes(bytes))
    }

    /// The id `n` (tests).
    pub fn from_u32(n: u32) -> Self {
        Self(format!("{n:0width$x}", width = ID_DIGITS))
    }
}

/// How many backups, and how old, retention keeps.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep at most this many (the newest); at least one is always kept.
    pub count: Option<usize>,
    /// Delete backups older than this, but never the newest.
    pub max_age: Option<Duration>,
}

/// The keys retention deletes among `keys` (a listing of the bucket under the cluster's
/// folder, in any order) at `now`: only this cluster's backups ([`Owner::taken_at`]); never
/// the newest; the oldest first.
pub fn expired(
    owner: &Owner<'_>,
    keys: &[String],
    retention: Retention,
    now: Timestamp,
) -> Vec<String> {
    let mut ours: Vec<(Timestamp, &String)> = keys
        .iter()
        .filter_map(|k| owner.taken_at(k).map(|t| (t, k)))
        .collect();
    // Newest first.
    ours.sort_by(|a, b| b.0.cmp(&a.0).then_with(|| b.1.cmp(a.1)));
    let keep = retention.count.unwrap_or(usize::MAX).max(1);
    let mut out: Vec<String> = ours
        .iter()
        .enumerate()
        .skip(1)
        .filter(|(index, (taken, _))| {
            let too_many = *index >= keep;
            let too_old = retention.max_age.is_some_and(|age| {
                now.duration_since(*taken)
                    .try_into()
                    .is_ok_and(|elapsed: Duration| elapsed > age)
            });
            too_many || too_old
        })
        .map(|(_, (_, key))| (*key).clone())
        .collect();
    out.reverse();
    out
}

/// Why `spec.backup.schedule` cannot be read: the field, and what is allowed.
#[derive(Debug, thiserror::Error)]
pub enum ScheduleError {
    /// An `@every` interval that is no duration, or shorter than a minute.
    #[error(
        "backup.schedule {0:?}: an @every interval must be a duration of at least 1m, e.g. @every 6h"
    )]
    Interval(String),
    /// Not a cron expression.
    #[error("backup.schedule {text:?} is not a five-field cron expression: {problem}")]
    Cron {
        /// The schedule as written.
        text: String,
        /// What the cron parser says.
        problem: croner::errors::CronError,
    },
}

/// What is wrong with a backup record read from the store (untrusted): the field, and the
/// shape Ichor writes it in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordShapeError {
    /// A checksum that is no SHA-256 in hex.
    #[error("{0} is not a SHA-256 in hex")]
    NotSha256(&'static str),
    /// `takenAt` is no time.
    #[error("takenAt is not an RFC 3339 time")]
    NotATime,
    /// A name too long, or with characters a status must not repeat.
    #[error("{0} is not a short printable name (at most {RECORD_TEXT} characters)")]
    NotAName(&'static str),
}

/// How a backup read back differs from its record.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RecordMismatch {
    /// What the record's `size` and `sha256` vouch for (the object, or before ADR 0050 its
    /// snapshot) reads otherwise.
    #[error(
        "{what} reads as {} bytes with sha256 {}, and the record says {} bytes with sha256 {}",
        read.size, read.sha256, recorded.size, recorded.sha256
    )]
    Vouched {
        /// `the object` or `its snapshot`.
        what: &'static str,
        /// As read.
        read: Digest,
        /// As recorded.
        recorded: Digest,
    },
    /// The snapshot inside the object reads otherwise than recorded.
    #[error(
        "the snapshot inside reads as {} bytes with sha256 {}, and the record says {} bytes with sha256 {}",
        read.size, read.sha256, recorded.size, recorded.sha256
    )]
    Snapshot {
        /// As read.
        read: Digest,
        /// As recorded.
        recorded: Digest,
    },
}

/// When backups run: an interval, or a cron expression (UTC).
#[derive(Debug, Clone)]
pub enum Schedule {
    /// `@every <duration>`.
    Every(Duration),
    /// A five-field cron expression.
    Cron(Box<croner::Cron>),
}

impl Schedule {
    /// Reads `spec.backup.schedule` (the CRD's rules already narrowed its shape).
    pub fn parse(text: &str) -> Result<Self, ScheduleError> {
        if let Some(every) = text.strip_prefix("@every ") {
            return ichor_api::time::parse_duration("backup.schedule", every.trim())
                .ok()
                .filter(|d| *d >= Duration::from_secs(60))
                .map(Self::Every)
                .ok_or_else(|| ScheduleError::Interval(text.to_owned()));
        }
        text.parse::<croner::Cron>()
            .map(|cron| Self::Cron(Box::new(cron)))
            .map_err(|problem| ScheduleError::Cron {
                text: text.to_owned(),
                problem,
            })
    }

    /// When the next backup is due. After an attempt (success or failure: a failing backup is
    /// not retried in a tight loop), the schedule's next time after it; with none yet, an
    /// interval is due at once and a cron expression at its first time after `created`. The
    /// answer depends only on recorded times, so every reconcile computes the same one.
    pub fn next(&self, last_attempt: Option<Timestamp>, created: Timestamp) -> Option<Timestamp> {
        match (self, last_attempt) {
            (Self::Every(_), None) => Some(created),
            (Self::Every(every), Some(last)) => {
                let every = k8s_openapi::jiff::SignedDuration::try_from(*every).ok()?;
                last.checked_add(every).ok()
            }
            (Self::Cron(cron), last) => {
                let after = last
                    .unwrap_or(created)
                    .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
                cron.find_next_occurrence(&after, false)
                    .ok()
                    .map(|z| z.timestamp())
            }
        }
    }
}

/// What the backup controller does for a cluster now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing until `due`.
    Wait {
        /// When the next backup is due.
        due: Timestamp,
    },
    /// Take a backup now.
    Run,
    /// Scheduled backups are suspended, or the cluster has no etcd yet.
    Idle,
}

/// How soon a failed backup is tried again, unless the schedule comes sooner.
pub const FAILURE_RETRY: Duration = Duration::from_secs(300);

/// The facts the schedule is judged on.
#[derive(Debug, Clone)]
pub struct Facts {
    /// Now.
    pub now: Timestamp,
    /// When the cluster was created.
    pub created: Timestamp,
    /// When the last successful backup was taken.
    pub last_success: Option<Timestamp>,
    /// When the last backup failed.
    pub last_failure: Option<Timestamp>,
    /// `spec.backup.suspend`.
    pub suspended: bool,
    /// Whether the cluster has a Ready control plane (so etcd runs and a snapshot can be
    /// taken).
    pub ready: bool,
}

/// Decides whether a scheduled backup runs now: when the schedule says, after the last
/// attempt; after a failure, within [`FAILURE_RETRY`] at the latest.
pub fn plan(schedule: &Schedule, facts: &Facts) -> Plan {
    if facts.suspended || !facts.ready {
        return Plan::Idle;
    }
    let last_attempt = facts.last_success.max(facts.last_failure);
    let Some(mut due) = schedule.next(last_attempt, facts.created) else {
        return Plan::Idle;
    };
    if let Some(failed) = facts.last_failure.filter(|f| Some(*f) > facts.last_success) {
        let retry = k8s_openapi::jiff::SignedDuration::try_from(FAILURE_RETRY)
            .ok()
            .and_then(|d| failed.checked_add(d).ok());
        if let Some(retry) = retry {
            due = due.min(retry);
        }
    }
    if due > facts.now {
        Plan::Wait { due }
    } else {
        Plan::Run
    }
}

/// A control plane a snapshot may come from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Source {
    /// The TalosMachine.
    pub machine: String,
    /// Its Talos API address.
    pub address: String,
    /// Whether it is a configured, Ready control plane.
    pub ready_control_plane: bool,
    /// Whether it is being removed (deleted, or a removal recorded).
    pub being_removed: bool,
}

/// The control planes a snapshot may be taken from, in the order to try them: Ready, not being
/// removed, by name. A node being removed is never a source.
pub fn sources(candidates: &[Source]) -> Vec<&Source> {
    let mut out: Vec<&Source> = candidates
        .iter()
        .filter(|s| s.ready_control_plane && !s.being_removed)
        .collect();
    out.sort_by(|a, b| a.machine.cmp(&b.machine));
    out
}

/// The suffix of the record written beside each backup object (`<key>.json`).
pub const RECORD_SUFFIX: &str = ".json";

/// What is recorded beside a backup: whose it is, made with which bundle, and what the object
/// and the snapshot inside it must check out as. A backup without its record is incomplete
/// and is never restored from.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Record {
    /// The TalosCluster's namespace.
    pub namespace: String,
    /// The TalosCluster's name.
    pub cluster: String,
    /// The TalosCluster's uid.
    pub uid: String,
    /// The fingerprint of the secrets bundle's OS CA (`sha256:`…), as
    /// `status.bundleFingerprint` records it.
    pub bundle_fingerprint: String,
    /// When the snapshot was taken (RFC 3339).
    pub taken_at: String,
    /// The object's size in bytes, as stored (in a record of before ADR 0050: the snapshot's).
    pub size: u64,
    /// The SHA-256 (hex) of the object as stored, ciphertext when encrypted: what `sha256sum`
    /// of the downloaded object prints (in a record of before ADR 0050: the snapshot's, before
    /// encryption).
    pub sha256: String,
    /// The etcd snapshot inside the object, before encryption. Absent from a record of before
    /// ADR 0050, whose `size` and `sha256` are the snapshot's.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot: Option<Digest>,
    /// Whether the object is encrypted with age.
    pub encrypted: bool,
    /// The control plane it came from.
    pub machine: String,
    /// The cluster's Talos version.
    pub talos_version: String,
}

/// A size and a SHA-256 (hex) of some bytes.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Digest {
    /// The size in bytes.
    pub size: u64,
    /// The SHA-256, lowercase hex.
    pub sha256: String,
}

/// What a backup's bytes were, as written or read back: the object as stored, and the etcd
/// snapshot in it (before encryption).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Digests {
    /// The object's bytes, as stored.
    pub object: Digest,
    /// The snapshot's, checked as an etcd snapshot (its trailer's value).
    pub snapshot: Digest,
}

/// Computes the [`Digest`] of bytes fed in order, holding none of them.
pub struct Hasher {
    context: ring::digest::Context,
    size: u64,
}

impl Default for Hasher {
    fn default() -> Self {
        Self {
            context: ring::digest::Context::new(&ring::digest::SHA256),
            size: 0,
        }
    }
}

impl Hasher {
    /// The next bytes.
    pub fn update(&mut self, bytes: &[u8]) {
        self.context.update(bytes);
        self.size += bytes.len() as u64;
    }

    /// The size and SHA-256 of all that was fed.
    pub fn finish(self) -> Digest {
        let sha256 = self
            .context
            .finish()
            .as_ref()
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        Digest {
            size: self.size,
            sha256,
        }
    }
}

/// The longest text field of a record that a status or an Event repeats.
const RECORD_TEXT: usize = 253;

impl Record {
    /// Whether the record covers the object as stored (written since ADR 0050), rather than
    /// only the snapshot in it.
    pub fn covers_object(&self) -> bool {
        self.snapshot.is_some()
    }

    /// Whether a record read from the store (untrusted) has the shape Ichor writes: hex
    /// checksums, a time, short printable names. What a status or an Event repeats of a record
    /// is checked here first.
    pub fn check_shape(&self) -> Result<(), RecordShapeError> {
        let hex = |what: &'static str, value: &str| {
            (value.len() == 64 && is_lower_hex(value))
                .then_some(())
                .ok_or(RecordShapeError::NotSha256(what))
        };
        hex("sha256", &self.sha256)?;
        if let Some(snapshot) = &self.snapshot {
            hex("snapshot.sha256", &snapshot.sha256)?;
        }
        self.taken_at
            .parse::<Timestamp>()
            .map_err(|_| RecordShapeError::NotATime)?;
        for (what, value) in [
            ("bundleFingerprint", &self.bundle_fingerprint),
            ("machine", &self.machine),
            ("talosVersion", &self.talos_version),
            ("namespace", &self.namespace),
            ("cluster", &self.cluster),
            ("uid", &self.uid),
        ] {
            if value.len() > RECORD_TEXT || !value.bytes().all(|b| b.is_ascii_graphic()) {
                return Err(RecordShapeError::NotAName(what));
            }
        }
        Ok(())
    }

    /// The part of `read` that this record's `size` and `sha256` describe: the object as
    /// stored, or for a record of before ADR 0050, the snapshot.
    pub fn vouched<'r>(&self, read: &'r Digests) -> &'r Digest {
        if self.covers_object() {
            &read.object
        } else {
            &read.snapshot
        }
    }

    /// Whether `read` is the backup this record describes: the object as stored (when the
    /// record covers it) and the snapshot inside; what differs otherwise.
    pub fn verify(&self, read: &Digests) -> Result<(), RecordMismatch> {
        let vouched = self.vouched(read);
        if vouched.sha256 != self.sha256 || vouched.size != self.size {
            let what = if self.covers_object() {
                "the object"
            } else {
                "its snapshot"
            };
            return Err(RecordMismatch::Vouched {
                what,
                read: vouched.clone(),
                recorded: Digest {
                    size: self.size,
                    sha256: self.sha256.clone(),
                },
            });
        }
        match &self.snapshot {
            Some(snapshot) if *snapshot != read.snapshot => Err(RecordMismatch::Snapshot {
                read: read.snapshot.clone(),
                recorded: snapshot.clone(),
            }),
            _ => Ok(()),
        }
    }
}

/// The key of the record of the backup at `key`.
pub fn record_key(key: &str) -> String {
    format!("{key}{RECORD_SUFFIX}")
}

/// The newest backup among `records` (backup keys and their records, any folders) whose record
/// says it was made with `bundle`: what a restore without a key restores. Newest by the
/// recorded time, read as a time (not as text: `…00Z` and `…00.5Z` do not sort as text).
pub fn latest_for_bundle<'a>(
    records: &'a [(String, Record)],
    bundle: &str,
) -> Option<&'a (String, Record)> {
    let time = |r: &Record| r.taken_at.parse::<Timestamp>().ok();
    records
        .iter()
        .filter(|(_, r)| r.bundle_fingerprint == bundle)
        .max_by(|a, b| time(&a.1).cmp(&time(&b.1)).then_with(|| a.0.cmp(&b.0)))
}

/// Why `endpoint` may not carry this backup or restore, if it may not: a plain `http://`
/// endpoint carries only encrypted snapshots, unless `store.allowPlainHttp` says otherwise.
pub fn plain_http_refusal(endpoint: &str, encrypted: bool, allowed: bool) -> Option<String> {
    let plain = endpoint
        .get(..7)
        .is_some_and(|scheme| scheme.eq_ignore_ascii_case("http://"));
    (plain && !encrypted && !allowed).then(|| {
        format!(
            "store.endpoint {endpoint} is plain http:// and the snapshot is not encrypted: every Secret of the cluster would cross the network in the clear; use https://, set encryption, or set store.allowPlainHttp: true"
        )
    })
}

/// Whether `key` names a backup object (not its record, not another file).
pub fn is_backup_key(key: &str) -> bool {
    key.ends_with(SNAPSHOT_SUFFIX) || key.ends_with(&format!("{SNAPSHOT_SUFFIX}{ENCRYPTED_SUFFIX}"))
}

/// What the schedule of `cluster` (whose `spec.backup` is `spec`) is judged on at `now`: its
/// status as `cluster` carries it.
pub(super) fn facts(now: Timestamp, cluster: &TalosCluster, spec: &BackupSpec) -> Facts {
    let status = cluster.status.clone().unwrap_or_default();
    let backups = status.backup.record.unwrap_or_default();
    Facts {
        now,
        created: cluster
            .metadata
            .creation_timestamp
            .as_ref()
            .map_or(now, |t| t.0),
        last_success: backups.last_success.as_ref().map(|s| s.taken_at.0),
        last_failure: backups.last_failure.as_ref().map(|t| t.0),
        suspended: spec.suspend,
        ready: status
            .core
            .control_planes
            .as_ref()
            .is_some_and(|c| c.ready > 0),
    }
}

/// How long from `now` until `due` (at least a second).
pub(super) fn until(now: Timestamp, due: Timestamp) -> Duration {
    due.duration_since(now)
        .try_into()
        .unwrap_or(Duration::ZERO)
        .max(Duration::from_secs(1))
}

/// The cluster's last successful backup, if it was taken no longer than `max_age` before
/// `now` (a rollout's fresh backup, ADR 0075).
pub fn fresh_success(
    cluster: &TalosCluster,
    now: Timestamp,
    max_age: Duration,
) -> Option<BackupRecord> {
    let last = cluster
        .status
        .as_ref()?
        .backup
        .record
        .as_ref()?
        .last_success
        .clone()?;
    let age: Duration = now
        .duration_since(last.taken_at.0)
        .try_into()
        .unwrap_or(Duration::ZERO);
    (age <= max_age).then_some(last)
}

/// The record of a backup of `cluster`, with what only the backup knows left empty.
pub(super) fn record_of(cluster: &TalosCluster) -> Record {
    Record {
        namespace: cluster.namespace().unwrap_or_default(),
        cluster: cluster.name_any(),
        uid: cluster.uid().unwrap_or_default(),
        bundle_fingerprint: String::new(),
        taken_at: String::new(),
        size: 0,
        sha256: String::new(),
        snapshot: None,
        encrypted: false,
        machine: String::new(),
        talos_version: cluster.spec.talos_version.clone(),
    }
}

/// The age sealer of `spec.encryption`, if any: to its recipient, the public key only (the
/// identity is never read by a backup).
pub(super) fn sealer(spec: &BackupSpec) -> Result<Option<Sealer>, Stop> {
    let Some(encryption) = spec.encryption.as_ref() else {
        return Ok(None);
    };
    if encryption.recipient.is_empty() {
        return Err(Stop::new(
            reasons::BACKUP_SETTINGS_INVALID,
            "spec.backup.encryption.recipient is not set: backups are encrypted to an age recipient (age1…, as `age-keygen -y <identity file>` prints it) and never read the identity; keySecretRef is only for restoreFrom",
        ));
    }
    Sealer::for_recipient(&encryption.recipient)
        .map(Some)
        .map_err(|message| {
            Stop::new(
                reasons::BACKUP_SETTINGS_INVALID,
                format!("spec.backup.encryption.recipient: {message}"),
            )
        })
}

/// The cluster's machines as snapshot sources (for an operation, only its machine).
pub(super) fn candidates(machines: &[TalosMachine], trigger: &Trigger) -> Vec<Source> {
    machines
        .iter()
        .filter(|m| match trigger {
            Trigger::Operation { machine, .. } => &m.name_any() == machine,
            Trigger::Scheduled | Trigger::Rollout { .. } => true,
        })
        .filter_map(|m| {
            let status = m.status.as_ref();
            Some(Source {
                machine: m.name_any(),
                address: crate::controller::machine::address(m)?,
                ready_control_plane: m.spec.role == Some(Role::ControlPlane)
                    && status.is_some_and(|s| {
                        s.applied.config_hash.is_some()
                            && cond::is_true(&s.conditions, conditions::READY)
                    }),
                being_removed: m.metadata.deletion_timestamp.is_some()
                    || status.is_some_and(|s| s.removal.progress.is_some()),
            })
        })
        .collect()
}

/// `spec.backup.retention`, with its default (the newest 7). A `maxAge` that does not read
/// deletes nothing for its age: the retention without it, and why.
pub(super) fn retention_of(
    spec: &BackupSpec,
) -> Result<Retention, (Retention, ichor_api::time::InvalidDuration)> {
    let Some(r) = spec.retention.as_ref() else {
        return Ok(Retention {
            count: Some(7),
            max_age: None,
        });
    };
    let count = r.count.and_then(|c| usize::try_from(c).ok());
    let max_age = r
        .max_age
        .as_deref()
        .map(|age| ichor_api::time::parse_duration("spec.backup.retention.maxAge", age))
        .transpose();
    match max_age {
        Ok(max_age) => Ok(Retention { count, max_age }),
        Err(invalid) => Err((
            Retention {
                count,
                max_age: None,
            },
            invalid,
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn owner() -> Owner<'static> {
        Owner {
            prefix: "/backups/",
            namespace: "ns",
            name: "lab",
            uid: "1234",
        }
    }

    fn at(text: &str) -> Timestamp {
        text.parse().expect("timestamp")
    }

    fn id(n: u32) -> BackupId {
        BackupId::from_u32(n)
    }

    #[test]
    fn a_success_is_fresh_for_a_rollout_until_it_is_older_than_the_age_asked() {
        let mut cluster = TalosCluster::test("lab").build();
        let hour = Duration::from_secs(3600);
        assert!(
            fresh_success(&cluster, at("2026-12-07T12:00:00Z"), hour).is_none(),
            "none yet"
        );
        let status = cluster.status.get_or_insert_with(Default::default);
        status.backup.record = Some(ichor_api::backup::BackupStatus {
            last_success: Some(BackupRecord {
                key: "k".into(),
                taken_at: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(at(
                    "2026-12-07T11:00:00Z",
                )),
                size: 1,
                sha256: String::new(),
                duration_seconds: 1.0,
                machine: "cp-1".into(),
                operation: None,
            }),
            ..Default::default()
        });
        assert!(fresh_success(&cluster, at("2026-12-07T12:00:00Z"), hour).is_some());
        assert!(fresh_success(&cluster, at("2026-12-07T12:00:01Z"), hour).is_none());
        // A success stamped later than now (a clock step back) is fresh, not a panic.
        assert!(fresh_success(&cluster, at("2026-12-07T10:00:00Z"), hour).is_some());
    }

    #[test]
    fn keys_say_whose_and_when_and_nothing_else_reads_as_ours() {
        let o = owner();
        let when = at("2026-12-04T03:15:00.25Z");
        let key = o.key(when, &id(0x1a2b3c4d), false);
        assert_eq!(
            key,
            "backups/ns/lab/1234/20261204T031500.250Z-1a2b3c4d.snapshot"
        );
        assert_eq!(o.taken_at(&key), Some(when));
        let sealed = o.key(when, &id(7), true);
        assert!(sealed.ends_with("Z-00000007.snapshot.age"), "{sealed}");
        assert_eq!(o.taken_at(&sealed), Some(when));
        // Keys written before ADR 0050, to the second, are still ours.
        for old in [
            "backups/ns/lab/1234/20261204T031500Z.snapshot",
            "backups/ns/lab/1234/20261204T031500Z.snapshot.age",
        ] {
            assert_eq!(o.taken_at(old), Some(at("2026-12-04T03:15:00Z")), "{old}");
        }
        for other in [
            "backups/ns/lab/9999/20261204T031500.000Z-1a2b3c4d.snapshot",
            "backups/ns/lab/1234/notes.txt",
            "backups/ns/lab/1234/sub/20261204T031500Z.snapshot",
            "backups/ns/lab/1234/2026-12-04.snapshot",
            "backups/ns/lab/1234/20261204T031500.000Z-1A2B3C4D.snapshot",
            "backups/ns/lab/1234/20261204T031500.000Z-mine.snapshot",
            "backups/ns/lab/1234/20261204T031500.000Z-1a2b3c4d.snapshot.json",
            "elsewhere/20261204T031500Z.snapshot",
        ] {
            assert_eq!(o.taken_at(other), None, "{other}");
        }
        let bare = Owner { prefix: "", ..o };
        assert_eq!(bare.folder(), "ns/lab/1234/");
    }

    #[test]
    fn two_backups_in_one_millisecond_get_two_keys_that_sort_by_time() {
        let o = owner();
        let when = at("2026-12-04T03:15:00.999Z");
        let (a, b) = (BackupId::random(), BackupId::random());
        assert_ne!(a, b, "random ids");
        assert_ne!(o.key(when, &a, false), o.key(when, &b, false));
        let later = at("2026-12-04T03:15:01Z");
        let mut keys = [
            o.key(later, &id(0), false),
            o.key(when, &id(u32::MAX), false),
            o.key(at("2026-12-04T03:14:59.001Z"), &id(5), false),
        ];
        keys.sort();
        let times: Vec<_> = keys.iter().map(|k| o.taken_at(k)).collect();
        assert!(times.is_sorted(), "{keys:?}");
    }

    #[test]
    fn retention_deletes_only_ours_oldest_first_and_never_the_newest() {
        let o = owner();
        let now = at("2026-12-10T00:00:00Z");
        let keys: Vec<String> = ["2026-12-01", "2026-12-05", "2026-12-09", "2026-12-03"]
            .iter()
            .map(|d| o.key(at(&format!("{d}T00:00:00Z")), &id(1), false))
            .chain(["backups/ns/lab/1234/keep-me.txt".to_owned()])
            .collect();
        let by_count = expired(
            &o,
            &keys,
            Retention {
                count: Some(2),
                max_age: None,
            },
            now,
        );
        assert_eq!(
            by_count,
            [
                o.key(at("2026-12-01T00:00:00Z"), &id(1), false),
                o.key(at("2026-12-03T00:00:00Z"), &id(1), false)
            ]
        );
        let by_age = expired(
            &o,
            &keys,
            Retention {
                count: None,
                max_age: Some(Duration::from_secs(6 * 86_400)),
            },
            now,
        );
        assert_eq!(
            by_age,
            [
                o.key(at("2026-12-01T00:00:00Z"), &id(1), false),
                o.key(at("2026-12-03T00:00:00Z"), &id(1), false)
            ]
        );
        // Everything too old: the newest stays all the same, and so with a count of zero.
        let all_old = expired(
            &o,
            &keys,
            Retention {
                count: Some(0),
                max_age: Some(Duration::from_secs(1)),
            },
            now,
        );
        assert_eq!(all_old.len(), 3);
        assert!(!all_old.contains(&o.key(at("2026-12-09T00:00:00Z"), &id(1), false)));
    }

    #[test]
    fn the_next_run_follows_the_last_attempt_and_cron_its_times() {
        let created = at("2026-12-04T00:10:00Z");
        let every = Schedule::parse("@every 1h").expect("interval");
        assert_eq!(
            every.next(None, created),
            Some(created),
            "none yet: due at once"
        );
        assert_eq!(
            every.next(Some(at("2026-12-04T01:30:00Z")), created),
            Some(at("2026-12-04T02:30:00Z")),
            "an attempt, failed or not, waits its interval"
        );
        let cron = Schedule::parse("0 */6 * * *").expect("cron");
        assert_eq!(cron.next(None, created), Some(at("2026-12-04T06:00:00Z")));
        assert_eq!(
            cron.next(Some(at("2026-12-04T06:00:00Z")), created),
            Some(at("2026-12-04T12:00:00Z"))
        );
        for bad in ["@every 10s", "@every soon", "61 * * * *", "* * *"] {
            assert!(Schedule::parse(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_backup_runs_when_due_on_a_bootstrapped_unsuspended_cluster() {
        let every = Schedule::parse("@every 1h").expect("interval");
        let facts = Facts {
            now: at("2026-12-04T02:00:00Z"),
            created: at("2026-12-04T00:00:00Z"),
            last_success: Some(at("2026-12-04T01:30:00Z")),
            last_failure: None,
            suspended: false,
            ready: true,
        };
        assert_eq!(
            plan(&every, &facts),
            Plan::Wait {
                due: at("2026-12-04T02:30:00Z")
            }
        );
        let due = Facts {
            now: at("2026-12-04T02:30:00Z"),
            ..facts.clone()
        };
        assert_eq!(plan(&every, &due), Plan::Run);
        let suspended = Facts {
            suspended: true,
            ..due.clone()
        };
        assert_eq!(plan(&every, &suspended), Plan::Idle);
        let no_etcd = Facts {
            ready: false,
            ..due
        };
        assert_eq!(plan(&every, &no_etcd), Plan::Idle);
        // A failure is retried within five minutes, not a whole day later.
        let daily = Schedule::parse("@every 24h").expect("interval");
        let failed = Facts {
            now: at("2026-12-04T02:03:00Z"),
            last_failure: Some(at("2026-12-04T02:00:00Z")),
            ..facts.clone()
        };
        assert_eq!(
            plan(&daily, &failed),
            Plan::Wait {
                due: at("2026-12-04T02:05:00Z")
            }
        );
        let recovered = Facts {
            last_success: Some(at("2026-12-04T02:10:00Z")),
            now: at("2026-12-04T02:11:00Z"),
            ..failed
        };
        assert_eq!(
            plan(&daily, &recovered),
            Plan::Wait {
                due: at("2026-12-05T02:10:00Z")
            },
            "a success after the failure: the schedule again"
        );
    }

    #[test]
    fn snapshots_come_from_ready_control_planes_never_one_being_removed() {
        let source = |machine: &str, ready: bool, removing: bool| Source {
            machine: machine.into(),
            address: format!("{machine}:50000"),
            ready_control_plane: ready,
            being_removed: removing,
        };
        let all = [
            source("cp-3", true, false),
            source("cp-1", true, true),
            source("cp-2", true, false),
            source("w-1", false, false),
        ];
        let order: Vec<&str> = sources(&all).iter().map(|s| s.machine.as_str()).collect();
        assert_eq!(order, ["cp-2", "cp-3"]);
    }

    fn record(bundle: &str, taken: &str) -> Record {
        Record {
            namespace: "ns".into(),
            cluster: "lab".into(),
            uid: "1".into(),
            bundle_fingerprint: bundle.into(),
            taken_at: taken.into(),
            size: 1,
            sha256: "0".repeat(64),
            snapshot: None,
            encrypted: false,
            machine: "cp-1".into(),
            talos_version: "v1.14.0".into(),
        }
    }

    #[test]
    fn the_latest_backup_of_a_bundle_is_the_one_restored() {
        let records = vec![
            ("a".to_owned(), record("sha256:x", "2026-12-04T01:00:00Z")),
            ("b".to_owned(), record("sha256:x", "2026-12-04T03:00:00.5Z")),
            ("d".to_owned(), record("sha256:x", "2026-12-04T03:00:00Z")),
            ("c".to_owned(), record("sha256:y", "2026-12-04T05:00:00Z")),
        ];
        assert_eq!(
            latest_for_bundle(&records, "sha256:x").map(|r| r.0.as_str()),
            Some("b"),
            "by time, not by text"
        );
        assert_eq!(latest_for_bundle(&records, "sha256:z"), None);
        assert!(is_backup_key("p/ns/lab/1/20261204T010000Z.snapshot"));
        assert!(is_backup_key(
            "p/ns/lab/1/20261204T010000.000Z-00000001.snapshot.age"
        ));
        assert!(!is_backup_key("p/ns/lab/1/20261204T010000Z.snapshot.json"));
    }

    #[test]
    fn a_record_vouches_for_the_object_as_stored_and_an_old_one_for_its_snapshot() {
        let digest = |size: u64, fill: &str| Digest {
            size,
            sha256: fill.repeat(64),
        };
        let read = Digests {
            object: digest(700, "a"),
            snapshot: digest(544, "b"),
        };
        let new = Record {
            size: 700,
            sha256: "a".repeat(64),
            snapshot: Some(digest(544, "b")),
            ..record("sha256:x", "2026-12-04T01:00:00Z")
        };
        assert_eq!(new.verify(&read), Ok(()));
        assert_eq!(new.vouched(&read), &read.object);
        let changed = Digests {
            object: digest(700, "c"),
            ..read.clone()
        };
        let message = new
            .verify(&changed)
            .expect_err("the object changed")
            .to_string();
        assert!(message.starts_with("the object reads as"), "{message}");
        let inside = Digests {
            snapshot: digest(544, "c"),
            ..read.clone()
        };
        assert!(new.verify(&inside).is_err(), "the snapshot inside changed");
        // Written before ADR 0050: the record's checksum is the snapshot's.
        let old = Record {
            size: 544,
            sha256: "b".repeat(64),
            ..record("sha256:x", "2026-12-04T01:00:00Z")
        };
        assert_eq!(old.verify(&read), Ok(()));
        assert_eq!(old.vouched(&read), &read.snapshot);
        assert!(old.verify(&inside).is_err());
    }

    #[test]
    fn a_record_from_the_store_has_the_shape_ichor_writes() {
        let good = record("sha256:x", "2026-12-04T01:00:00Z");
        assert_eq!(good.check_shape(), Ok(()));
        for bad in [
            Record {
                sha256: "\u{1b}[31m".into(),
                ..good.clone()
            },
            Record {
                bundle_fingerprint: "x".repeat(10_000),
                ..good.clone()
            },
            Record {
                machine: "cp-1\nforged line".into(),
                ..good.clone()
            },
            Record {
                taken_at: "yesterday".into(),
                ..good.clone()
            },
        ] {
            assert!(bad.check_shape().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn plain_http_carries_only_encrypted_snapshots_unless_allowed() {
        let refused = plain_http_refusal("http://s3.lan:9000", false, false);
        assert!(
            refused.is_some_and(|m| m.contains("store.allowPlainHttp")),
            "plain and unencrypted"
        );
        assert!(plain_http_refusal("HTTP://s3.lan", false, false).is_some());
        assert_eq!(plain_http_refusal("http://s3.lan", true, false), None);
        assert_eq!(plain_http_refusal("http://s3.lan", false, true), None);
        assert_eq!(plain_http_refusal("https://s3.lan", false, false), None);
    }
}
