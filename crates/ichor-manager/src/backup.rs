//! Etcd backups to object storage, the pure part: where a backup goes (its object key, which
//! says whose it is and when it was taken), which objects are Ichor's backups of a cluster
//! and none other's, which of them retention deletes, and when the next one is due. The
//! controller that streams snapshots to the store builds on these; nothing here does I/O.

use std::time::Duration;

use k8s_openapi::jiff::Timestamp;

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

    /// The key of a backup taken at `at`: the folder, then the time in UTC to the second
    /// (`20261204T031500Z`), so keys sort by time.
    pub fn key(&self, at: Timestamp, encrypted: bool) -> String {
        let time = at.strftime("%Y%m%dT%H%M%SZ");
        let suffix = if encrypted {
            format!("{SNAPSHOT_SUFFIX}{ENCRYPTED_SUFFIX}")
        } else {
            SNAPSHOT_SUFFIX.to_owned()
        };
        format!("{}{time}{suffix}", self.folder())
    }

    /// When the backup at `key` was taken, if `key` is one of this cluster's backups: in its
    /// folder, named as [`key`](Self::key) names them. Anything else in the bucket is not
    /// Ichor's to touch.
    pub fn taken_at(&self, key: &str) -> Option<Timestamp> {
        let name = key.strip_prefix(&self.folder())?;
        let stem = name
            .strip_suffix(ENCRYPTED_SUFFIX)
            .unwrap_or(name)
            .strip_suffix(SNAPSHOT_SUFFIX)?;
        if stem.len() != 16 || stem.contains('/') {
            return None;
        }
        let civil = k8s_openapi::jiff::civil::DateTime::strptime("%Y%m%dT%H%M%SZ", stem).ok()?;
        civil
            .to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC)
            .ok()
            .map(|z| z.timestamp())
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

/// When the next backup is due with an interval schedule: `every` after the last success
/// (or the last attempt, so that a failing backup is not retried in a tight loop), or now
/// when there was none.
pub fn next_run(
    every: Duration,
    last_success: Option<Timestamp>,
    last_attempt: Option<Timestamp>,
) -> Option<Timestamp> {
    let last = [last_success, last_attempt].into_iter().flatten().max()?;
    let every = k8s_openapi::jiff::SignedDuration::try_from(every).ok()?;
    last.checked_add(every).ok()
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

    #[test]
    fn keys_say_whose_and_when_and_nothing_else_reads_as_ours() {
        let o = owner();
        let key = o.key(at("2026-12-04T03:15:00Z"), false);
        assert_eq!(key, "backups/ns/lab/1234/20261204T031500Z.snapshot");
        assert_eq!(o.taken_at(&key), Some(at("2026-12-04T03:15:00Z")));
        let sealed = o.key(at("2026-12-04T03:15:00Z"), true);
        assert!(sealed.ends_with(".snapshot.age"));
        assert_eq!(o.taken_at(&sealed), Some(at("2026-12-04T03:15:00Z")));
        for other in [
            "backups/ns/lab/9999/20261204T031500Z.snapshot",
            "backups/ns/lab/1234/notes.txt",
            "backups/ns/lab/1234/sub/20261204T031500Z.snapshot",
            "backups/ns/lab/1234/2026-12-04.snapshot",
            "elsewhere/20261204T031500Z.snapshot",
        ] {
            assert_eq!(o.taken_at(other), None, "{other}");
        }
        let bare = Owner { prefix: "", ..o };
        assert_eq!(bare.folder(), "ns/lab/1234/");
    }

    #[test]
    fn retention_deletes_only_ours_oldest_first_and_never_the_newest() {
        let o = owner();
        let now = at("2026-12-10T00:00:00Z");
        let keys: Vec<String> = ["2026-12-01", "2026-12-05", "2026-12-09", "2026-12-03"]
            .iter()
            .map(|d| o.key(at(&format!("{d}T00:00:00Z")), false))
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
                o.key(at("2026-12-01T00:00:00Z"), false),
                o.key(at("2026-12-03T00:00:00Z"), false)
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
                o.key(at("2026-12-01T00:00:00Z"), false),
                o.key(at("2026-12-03T00:00:00Z"), false)
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
        assert!(!all_old.contains(&o.key(at("2026-12-09T00:00:00Z"), false)));
    }

    #[test]
    fn the_next_run_follows_the_last_success_or_attempt() {
        let hour = Duration::from_secs(3600);
        assert_eq!(next_run(hour, None, None), None, "none yet: due now");
        assert_eq!(
            next_run(hour, Some(at("2026-12-04T01:00:00Z")), None),
            Some(at("2026-12-04T02:00:00Z"))
        );
        assert_eq!(
            next_run(
                hour,
                Some(at("2026-12-04T01:00:00Z")),
                Some(at("2026-12-04T01:30:00Z"))
            ),
            Some(at("2026-12-04T02:30:00Z")),
            "a failed attempt waits its interval too"
        );
    }
}
