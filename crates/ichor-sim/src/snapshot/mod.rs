//! Etcd snapshots as a Talos control plane streams them (talos-facts §12): the member's bbolt
//! database — the buckets etcd 3.6's backend keeps, the simulated Kubernetes keyspace in `key`
//! — followed by the SHA-256 of those bytes, in chunks of at most 1 KiB; and what Bootstrap
//! does with a snapshot uploaded with `EtcdRecover` when it recovers from it ([`restore`],
//! reading the file with [`read`]).
//!
//! The database is written by [`bolt`] from [`keyspace::Keyspace`] on a blocking thread while
//! the stream is read, so even a large one is never held whole in memory.

pub(crate) mod bolt;
pub(crate) mod keyspace;
pub(crate) mod read;
pub(crate) mod restore;

use std::io::{self, Write};
use std::pin::Pin;

use ichor_talos::api::common::Data;
use tonic::Status;

use bolt::{Entries, Plan, Small};
use keyspace::Keyspace;

/// How many bytes each `common.Data` message carries at most (Talos's chunker reads 1 KiB at a
/// time, talos-facts §12.1).
const CHUNK: usize = 1024;

/// The storage version etcd 3.6 records (`meta/storageVersion`, talos-facts §12.3).
const STORAGE_VERSION: &str = "3.6.0";

/// One member as the `members` bucket and the raft configuration hold it.
#[derive(Debug, Clone)]
pub(crate) struct MemberView {
    pub(crate) id: u64,
    pub(crate) name: String,
    pub(crate) peer_urls: Vec<String>,
    pub(crate) client_urls: Vec<String>,
    pub(crate) learner: bool,
}

/// What a snapshot is taken of: a cluster's keyspace, members and raft position.
#[derive(Debug, Clone)]
pub(crate) struct ClusterView {
    pub(crate) keyspace: std::sync::Arc<Keyspace>,
    pub(crate) members: Vec<MemberView>,
    pub(crate) raft_index: u64,
    pub(crate) raft_term: u64,
}

fn json_string(s: &str) -> String {
    serde_json::Value::String(s.to_owned()).to_string()
}

impl ClusterView {
    /// The small buckets etcd's backend keeps besides `key` (talos-facts §12.3).
    fn small_buckets(&self) -> Vec<(&'static [u8], Small)> {
        let ids = |learner: bool| {
            self.members
                .iter()
                .filter(|m| m.learner == learner)
                .map(|m| m.id.to_string())
                .collect::<Vec<_>>()
                .join(",")
        };
        let mut conf_state = format!("{{\"voters\":[{}]", ids(false));
        if self.members.iter().any(|m| m.learner) {
            conf_state.push_str(&format!(",\"learners\":[{}]", ids(true)));
        }
        conf_state.push_str(",\"auto_leave\":false}");
        let mut meta = vec![
            (b"confState".to_vec(), conf_state.into_bytes()),
            (
                b"consistent_index".to_vec(),
                self.raft_index.to_be_bytes().to_vec(),
            ),
            (b"term".to_vec(), self.raft_term.to_be_bytes().to_vec()),
            (
                b"storageVersion".to_vec(),
                STORAGE_VERSION.as_bytes().to_vec(),
            ),
        ];
        meta.extend(self.keyspace.compaction());
        let meta = Small::new(meta);
        let members = Small::new(
            self.members
                .iter()
                .map(|m| {
                    let urls = |urls: &[String]| {
                        urls.iter()
                            .map(|u| json_string(u))
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    let mut json =
                        format!("{{\"id\":{},\"peerURLs\":[{}]", m.id, urls(&m.peer_urls));
                    if m.learner {
                        json.push_str(",\"isLearner\":true");
                    }
                    if !m.name.is_empty() {
                        json.push_str(&format!(",\"name\":{}", json_string(&m.name)));
                    }
                    if !m.client_urls.is_empty() {
                        json.push_str(&format!(",\"clientURLs\":[{}]", urls(&m.client_urls)));
                    }
                    json.push('}');
                    (format!("{:x}", m.id).into_bytes(), json.into_bytes())
                })
                .collect(),
        );
        vec![
            (b"alarm", Small::default()),
            (
                b"auth",
                Small::new(vec![
                    (b"authEnabled".to_vec(), vec![0]),
                    (b"authRevision".to_vec(), 1u64.to_be_bytes().to_vec()),
                ]),
            ),
            (b"authRoles", Small::default()),
            (b"authUsers", Small::default()),
            (
                b"cluster",
                Small::new(vec![(
                    b"clusterVersion".to_vec(),
                    STORAGE_VERSION.as_bytes().to_vec(),
                )]),
            ),
            (b"lease", Small::new(self.keyspace.leases())),
            (b"members", members),
            (b"members_removed", Small::default()),
            (b"meta", meta),
        ]
    }

    /// Plans the database and hands the plan to `f`.
    fn with_plan<T>(&self, f: impl FnOnce(&Plan<'_>) -> T) -> T {
        let small = self.small_buckets();
        let mut buckets: Vec<(&[u8], &dyn Entries)> = small
            .iter()
            .map(|(name, entries)| (*name, entries as &dyn Entries))
            .collect();
        buckets.push((b"key", self.keyspace.as_ref() as &dyn Entries));
        f(&Plan::new(buckets, self.raft_index.max(2)))
    }

    /// The size of the database in bytes (what etcd reports as its db size).
    pub(crate) fn db_size(&self) -> u64 {
        let members = format!("{:?}", self.members);
        self.keyspace
            .db_size(members, || self.with_plan(|plan| plan.size()))
    }

    /// Writes the snapshot — the database, then its SHA-256 — to `out`.
    pub(crate) fn write(&self, out: &mut dyn Write) -> io::Result<()> {
        let mut hashing = Hashing {
            inner: out,
            digest: ring::digest::Context::new(&ring::digest::SHA256),
        };
        self.with_plan(|plan| plan.write(&mut hashing))?;
        let digest = hashing.digest.finish();
        hashing.inner.write_all(digest.as_ref())?;
        hashing.inner.flush()
    }

    /// The snapshot as the `EtcdSnapshot` stream sends it: written on a blocking thread while
    /// it is read, in `common.Data` messages of at most 1 KiB; a client that goes away stops
    /// the writing.
    pub(crate) fn stream(self) -> SnapshotStream {
        let (tx, rx) = tokio::sync::mpsc::channel::<Result<Data, Status>>(256);
        tokio::task::spawn_blocking(move || {
            let mut chunks = Chunks {
                tx: tx.clone(),
                pending: Vec::with_capacity(CHUNK),
            };
            if let Err(error) = self.write(&mut chunks)
                && error.kind() != io::ErrorKind::BrokenPipe
            {
                let _ = tx.blocking_send(Err(Status::internal(format!(
                    "failed reading etcd snapshot: {error}"
                ))));
            }
        });
        Box::pin(tokio_stream::wrappers::ReceiverStream::new(rx))
    }
}

/// The stream of an `EtcdSnapshot` reply.
pub(crate) type SnapshotStream =
    Pin<Box<dyn tokio_stream::Stream<Item = Result<Data, Status>> + Send>>;

/// A writer that hashes what passes through it.
struct Hashing<'a> {
    inner: &'a mut dyn Write,
    digest: ring::digest::Context,
}

impl Write for Hashing<'_> {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.digest.update(&buf[..n]);
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.inner.flush()
    }
}

/// A writer that cuts what it gets into messages of at most [`CHUNK`] bytes and sends them,
/// waiting while the stream's buffer is full; `BrokenPipe` once the reader is gone.
struct Chunks {
    tx: tokio::sync::mpsc::Sender<Result<Data, Status>>,
    pending: Vec<u8>,
}

impl Chunks {
    fn send(&mut self) -> io::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        let bytes = std::mem::replace(&mut self.pending, Vec::with_capacity(CHUNK));
        self.tx
            .blocking_send(Ok(Data {
                metadata: None,
                bytes,
            }))
            .map_err(|_| io::Error::from(io::ErrorKind::BrokenPipe))
    }
}

impl Write for Chunks {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        let n = buf.len().min(CHUNK - self.pending.len());
        self.pending.extend_from_slice(&buf[..n]);
        if self.pending.len() == CHUNK {
            self.send()?;
        }
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.send()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    fn view(seed: u64, size: u64) -> ClusterView {
        ClusterView {
            keyspace: Arc::new(Keyspace::new(seed, size)),
            members: vec![
                MemberView {
                    id: 0x1234_5678_9abc_def0,
                    name: "cp-1".into(),
                    peer_urls: vec!["https://127.0.0.1:2380".into()],
                    client_urls: vec!["https://127.0.0.1:2379".into()],
                    learner: false,
                },
                MemberView {
                    id: 42,
                    name: "cp-2".into(),
                    peer_urls: vec!["https://127.0.0.2:2380".into()],
                    client_urls: vec!["https://127.0.0.2:2379".into()],
                    learner: true,
                },
            ],
            raft_index: 1234,
            raft_term: 3,
        }
    }

    fn snapshot(view: &ClusterView) -> Vec<u8> {
        let mut out = Vec::new();
        view.write(&mut out).expect("write");
        out
    }

    fn u64_at(file: &[u8], at: usize) -> u64 {
        let mut b = [0u8; 8];
        b.copy_from_slice(&file[at..at + 8]);
        u64::from_le_bytes(b)
    }

    fn u32_at(file: &[u8], at: usize) -> usize {
        let mut b = [0u8; 4];
        b.copy_from_slice(&file[at..at + 4]);
        u32::from_le_bytes(b) as usize
    }

    /// A reader of what the writer writes, independent of it: every entry of the tree at
    /// `id` in order, and the tree's depth.
    fn walk(file: &[u8], id: u64, out: &mut Vec<(Vec<u8>, Vec<u8>)>) -> usize {
        let at = usize::try_from(id).expect("id") * bolt::PAGE;
        assert_eq!(u64_at(file, at), id, "page {id} names itself");
        let flags = u16::from_le_bytes([file[at + 8], file[at + 9]]);
        let count = usize::from(u16::from_le_bytes([file[at + 10], file[at + 11]]));
        let page = &file[at..];
        match flags {
            0x01 => {
                let mut depth = 0;
                for i in 0..count {
                    let e = 16 + 16 * i;
                    let pos = u32_at(page, e);
                    let ksize = u32_at(page, e + 4);
                    let child = u64_at(page, e + 8);
                    let first = out.len();
                    depth = walk(file, child, out);
                    assert_eq!(
                        out[first].0,
                        page[e + pos..e + pos + ksize],
                        "a branch key is its child's first key"
                    );
                }
                depth + 1
            }
            0x02 => {
                leaf_entries(page, count, out);
                1
            }
            other => panic!("page {id}: flags {other:x}"),
        }
    }

    fn leaf_entries(page: &[u8], count: usize, out: &mut Vec<(Vec<u8>, Vec<u8>)>) {
        for i in 0..count {
            let e = 16 + 16 * i;
            let pos = e + u32_at(page, e + 4);
            let ksize = u32_at(page, e + 8);
            let vsize = u32_at(page, e + 12);
            out.push((
                page[pos..pos + ksize].to_vec(),
                page[pos + ksize..pos + ksize + vsize].to_vec(),
            ));
        }
    }

    type Bucket = (String, Vec<(Vec<u8>, Vec<u8>)>, usize);

    /// Every bucket of a snapshot's database with its entries and depth (0: inline).
    fn buckets(file: &[u8]) -> Vec<Bucket> {
        let root = u64_at(file, 16 + 16);
        let mut top = Vec::new();
        walk(file, root, &mut top);
        top.into_iter()
            .map(|(name, value)| {
                let mut entries = Vec::new();
                let bucket_root = u64_at(&value, 0);
                let depth = if bucket_root == 0 {
                    let page = &value[16..];
                    let count = usize::from(u16::from_le_bytes([page[10], page[11]]));
                    leaf_entries(page, count, &mut entries);
                    0
                } else {
                    walk(file, bucket_root, &mut entries)
                };
                (String::from_utf8(name).expect("name"), entries, depth)
            })
            .collect()
    }

    #[test]
    fn a_snapshot_is_a_bbolt_database_followed_by_its_sha256() {
        let file = snapshot(&view(7, 256 << 10));
        assert_eq!(file.len() % 512, 32, "talosctl looks for the trailer so");
        let (db, trailer) = file.split_at(file.len() - 32);
        assert_eq!(
            ring::digest::digest(&ring::digest::SHA256, db).as_ref(),
            trailer
        );
        assert_eq!(db.len() % bolt::PAGE, 0);
        let meta = bolt::read_meta(db).expect("meta");
        assert_eq!(meta.pages * bolt::PAGE as u64, db.len() as u64);
        assert_eq!(
            meta.txid, 1234,
            "the newer meta page records the raft index"
        );
        assert_eq!(restore::verdict(&file, false), Ok(()));
    }

    #[test]
    fn the_buckets_are_etcds_with_the_meta_values_etcd_reads() {
        let v = view(7, 256 << 10);
        let found = buckets(&snapshot(&v));
        let names: Vec<&str> = found.iter().map(|b| b.0.as_str()).collect();
        assert_eq!(
            names,
            [
                "alarm",
                "auth",
                "authRoles",
                "authUsers",
                "cluster",
                "key",
                "lease",
                "members",
                "members_removed",
                "meta"
            ]
        );
        let meta = &found.iter().find(|b| b.0 == "meta").expect("meta").1;
        let get = |k: &str| {
            meta.iter()
                .find(|(key, _)| key == k.as_bytes())
                .map(|(_, v)| v.clone())
        };
        assert_eq!(
            get("consistent_index"),
            Some(1234u64.to_be_bytes().to_vec())
        );
        assert_eq!(get("term"), Some(3u64.to_be_bytes().to_vec()));
        assert_eq!(get("storageVersion"), Some(b"3.6.0".to_vec()));
        assert_eq!(
            get("confState"),
            Some(
                format!(
                    "{{\"voters\":[{}],\"learners\":[42],\"auto_leave\":false}}",
                    0x1234_5678_9abc_def0u64
                )
                .into_bytes()
            )
        );
        let members = &found.iter().find(|b| b.0 == "members").expect("members").1;
        assert_eq!(members.len(), 2);
        assert_eq!(members[0].0, b"123456789abcdef0");
    }

    #[test]
    fn a_large_key_bucket_reads_back_in_revision_order_across_branch_levels() {
        let v = view(11, 24 << 20);
        let file = snapshot(&v);
        let found = buckets(&file);
        let (_, entries, depth) = found.iter().find(|b| b.0 == "key").expect("key");
        assert!(
            *depth >= 3,
            "leaves under two levels of branch pages: {depth}"
        );
        let summary = v.keyspace.summary();
        assert_eq!(entries.len(), summary.entries);
        assert!(
            entries.windows(2).all(|w| w[0].0 < w[1].0),
            "ascending revisions"
        );
        assert_eq!(
            entries.last().map(|e| e.0[..8].to_vec()),
            Some((summary.revision as u64).to_be_bytes().to_vec())
        );
        let db = file.len() as u64 - 32;
        let target = 24u64 << 20;
        assert!(
            db.abs_diff(target) < target / 10,
            "{db} bytes for a target of {target}"
        );
        assert_eq!(v.db_size(), db, "etcd status reports the snapshot's size");
    }

    #[test]
    fn large_objects_take_overflow_pages() {
        // Custom resource definitions (8-40 KiB) come with every eighth application.
        let file = snapshot(&view(5, 2 << 20));
        let found = buckets(&file);
        let (_, entries, _) = found.iter().find(|b| b.0 == "key").expect("key");
        assert!(entries.iter().any(|(_, v)| v.len() > 2 * bolt::PAGE));
    }

    #[test]
    fn the_same_cluster_always_has_the_same_keyspace_and_another_one_another() {
        let a = snapshot(&view(3, 512 << 10));
        assert_eq!(a, snapshot(&view(3, 512 << 10)));
        assert_ne!(a, snapshot(&view(4, 512 << 10)));
        let summary = Keyspace::new(3, 512 << 10).summary();
        assert!(summary.keys > 250, "{summary:?}");
        assert!(
            summary.entries > summary.keys,
            "lease renewals and deleted events add entries: {summary:?}"
        );
    }

    #[test]
    fn an_upload_is_checked_as_a_restore_will_check_it() {
        let file = snapshot(&view(3, 256 << 10));
        assert_eq!(restore::verdict(&file, false), Ok(()));
        let error = |file: &[u8], skip| restore::verdict(file, skip).map_err(|f| f.error);

        // A trailer that does not match: the database is sound, the hash check refuses it.
        let mut wrong = file.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        let refused = error(&wrong, false).expect_err("a hash mismatch");
        assert!(
            refused.starts_with("error recovering from the snapshot: expected sha256 ["),
            "{refused}"
        );
        assert_eq!(error(&wrong, true), Ok(()));

        // No trailer (a database copied from a data directory).
        let bare = &file[..file.len() - 32];
        assert_eq!(
            error(bare, false),
            Err(
                "error recovering from the snapshot: snapshot missing hash but --skip-hash-check=false"
                    .into()
            )
        );
        assert_eq!(error(bare, true), Ok(()));

        // A broken page fails bbolt's check before any hash is looked at.
        let mut broken = file.clone();
        broken[bolt::PAGE * 3 + 100] ^= 1;
        let refused = error(&broken, true).expect_err("a broken page");
        assert!(
            refused.starts_with("error verifying snapshot: snapshot file integrity check failed. "),
            "{refused}"
        );

        let text = b"ichor-sim etcd snapshot\n";
        assert_eq!(
            error(text, true),
            Err("error verifying snapshot: the file is too small for a bbolt meta page".into())
        );
    }

    /// `view` with another keyspace.
    fn with_keyspace(v: &ClusterView, keyspace: Keyspace) -> ClusterView {
        ClusterView {
            keyspace: Arc::new(keyspace),
            ..v.clone()
        }
    }

    fn key_bucket(file: &[u8]) -> Vec<(Vec<u8>, Vec<u8>)> {
        buckets(file)
            .into_iter()
            .find(|b| b.0 == "key")
            .map(|b| b.1)
            .expect("a key bucket")
    }

    #[test]
    fn the_reader_reads_what_the_writer_wrote_and_bbolts_check_passes() {
        for size in [256 << 10, 24 << 20] {
            let file = snapshot(&view(11, size));
            let db = read::Db::open(&file).expect("open");
            assert_eq!(db.check(), Vec::<String>::new(), "{size}");
            let mut entries = Vec::new();
            let bucket = db.bucket(b"key").expect("read").expect("a key bucket");
            db.entries(bucket, &mut |(_, k, v)| {
                entries.push((k.to_vec(), v.to_vec()));
                Ok(())
            })
            .expect("entries");
            assert_eq!(entries, key_bucket(&file), "{size}");
            assert_eq!(restore::status(&file), Ok(()));
        }
    }

    #[test]
    fn bbolts_check_finds_what_it_would() {
        let file = snapshot(&view(11, 256 << 10));
        // The first leaf of `key`: swap its first two elements' headers, out of key order.
        let mut swapped = file.clone();
        let leaf = bolt::PAGE * 3;
        let (a, b) = (leaf + 16, leaf + 32);
        let first: Vec<u8> = swapped[a..a + 16].to_vec();
        let second: Vec<u8> = swapped[b..b + 16].to_vec();
        // Positions are relative to each element: move them with the element.
        let pos = |e: &[u8]| u32::from_le_bytes([e[4], e[5], e[6], e[7]]);
        let mut first_moved = first.clone();
        first_moved[4..8].copy_from_slice(&(pos(&first) - 16).to_le_bytes());
        let mut second_moved = second.clone();
        second_moved[4..8].copy_from_slice(&(pos(&second) + 16).to_le_bytes());
        swapped[a..a + 16].copy_from_slice(&second_moved);
        swapped[b..b + 16].copy_from_slice(&first_moved);
        let errors = read::Db::open(&swapped).expect("open").check();
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert!(
            errors[0].starts_with("key[1]=(hex)")
                && errors[0].contains(
                    "on leaf page(3) needs to be > (found <) than previous element (hex)"
                ),
            "{errors:?}"
        );
        let refused = restore::status(&swapped).expect_err("refused");
        assert!(
            refused.starts_with("snapshot file integrity check failed. 1 errors found.\nkey[1]"),
            "{refused}"
        );

        // A page nothing points to, not free.
        let mut grown = file[..file.len() - 32].to_vec();
        grown.extend_from_slice(&[0; bolt::PAGE]);
        let pages = (grown.len() / bolt::PAGE) as u64;
        // Meta page 0 names one page more, its checksum made again.
        grown[16 + 40..16 + 48].copy_from_slice(&pages.to_le_bytes());
        let checksum = bolt_fnv(&grown[16..16 + 56]);
        grown[16 + 56..16 + 64].copy_from_slice(&checksum.to_le_bytes());
        let errors = read::Db::open(&grown).expect("open").check();
        assert_eq!(errors, [format!("page {}: unreachable unfreed", pages - 1)]);
    }

    fn bolt_fnv(bytes: &[u8]) -> u64 {
        bytes.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, &b| {
            (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
        })
    }

    #[test]
    fn writes_follow_the_history_at_the_next_revisions_as_etcd_writes_them() {
        let base = Keyspace::new(3, 256 << 10);
        let last = base.summary().revision;
        let keys = base.summary().keys;
        assert!(base.get(b"/registry/namespaces/default").is_some());
        assert_eq!(base.get(b"/test/a"), None);

        let (one, rev) = base
            .with_change(b"/test/a", Some(b"1".to_vec()))
            .expect("put");
        assert_eq!(rev, last + 1);
        let (two, rev) = one
            .with_change(b"/test/a", Some(b"2".to_vec()))
            .expect("put");
        assert_eq!(rev, last + 2);
        let (three, _) = two
            .with_change(b"/registry/namespaces/default", Some(b"mine".to_vec()))
            .expect("put");
        assert_eq!(three.get(b"/test/a"), Some(b"2".to_vec()));
        assert_eq!(
            three.get(b"/registry/namespaces/default"),
            Some(b"mine".to_vec())
        );
        assert_eq!(three.summary().keys, keys + 1);
        assert!(
            three.with_change(b"/test/none", None).is_none(),
            "nothing to delete"
        );
        let (four, rev) = three.with_change(b"/test/a", None).expect("delete");
        assert_eq!(rev, last + 4);
        assert_eq!(four.get(b"/test/a"), None);
        assert_eq!(four.summary().keys, keys);
        assert_eq!(four.summary().revision, last + 4);
        assert_eq!(base.get(b"/test/a"), None, "the history is not changed");

        // In the key bucket: each a KeyValue under its revision, as etcd's mvcc keeps them.
        let v = view(3, 256 << 10);
        let file = snapshot(&with_keyspace(&v, four));
        assert_eq!(restore::status(&file), Ok(()));
        let entries = key_bucket(&file);
        let tail: Vec<_> = entries[entries.len() - 4..]
            .iter()
            .map(|(k, v)| {
                let kv = keyspace::KeyValue::parse(v).expect("a KeyValue");
                (
                    u64::from_be_bytes(k[..8].try_into().expect("8 bytes")),
                    keyspace::is_tombstone(k),
                    String::from_utf8_lossy(kv.key).into_owned(),
                    kv.create,
                    kv.modified,
                    kv.version,
                    kv.value.to_vec(),
                )
            })
            .collect();
        let r = |n: i64| u64::try_from(last + n).expect("positive");
        let default_create = tail[2].3;
        assert!(
            default_create > 0 && default_create <= last,
            "created in the history"
        );
        assert_eq!(
            tail,
            [
                (
                    r(1),
                    false,
                    "/test/a".into(),
                    last + 1,
                    last + 1,
                    1,
                    b"1".to_vec()
                ),
                (
                    r(2),
                    false,
                    "/test/a".into(),
                    last + 1,
                    last + 2,
                    2,
                    b"2".to_vec()
                ),
                (
                    r(3),
                    false,
                    "/registry/namespaces/default".into(),
                    default_create,
                    last + 3,
                    tail[2].5,
                    b"mine".to_vec()
                ),
                (r(4), true, "/test/a".into(), 0, 0, 0, Vec::new()),
            ]
        );
    }

    #[test]
    fn a_restored_keyspace_is_the_snapshots_and_grows_from_there() {
        let v = view(7, 512 << 10);
        let (written, _) = v
            .keyspace
            .with_change(b"/test/kept", Some(b"before".to_vec()))
            .expect("put");
        let original = with_keyspace(&v, written);
        let file = snapshot(&original);
        let restored = restore::recover(Some(&Arc::new(file.clone())), false).expect("recovered");
        assert_eq!(restored.summary(), original.keyspace.summary());
        assert_eq!(restored.get(b"/test/kept"), Some(b"before".to_vec()));
        assert_eq!(
            restored.get(b"/registry/namespaces/default"),
            original.keyspace.get(b"/registry/namespaces/default")
        );
        // Another cluster (other members) snapshots the same key bucket, leases, compaction.
        let other = ClusterView {
            members: v.members[..1].to_vec(),
            ..with_keyspace(&v, restored)
        };
        let again = snapshot(&other);
        assert_eq!(key_bucket(&again), key_bucket(&file));
        let small = |f: &[u8], name: &str, key: Option<&[u8]>| {
            buckets(f)
                .into_iter()
                .find(|b| b.0 == name)
                .map(|b| {
                    b.1.into_iter()
                        .filter(|(k, _)| key.is_none_or(|key| k == key))
                        .collect::<Vec<_>>()
                })
                .expect("bucket")
        };
        assert_eq!(small(&again, "lease", None), small(&file, "lease", None));
        for key in [&b"finishedCompactRev"[..], b"scheduledCompactRev"] {
            assert_eq!(
                small(&again, "meta", Some(key)),
                small(&file, "meta", Some(key))
            );
        }

        // Written on top, snapshotted, restored again: everything is there.
        let (more, _) = other
            .keyspace
            .with_change(b"/test/after", Some(b"after".to_vec()))
            .expect("put");
        let third = snapshot(&with_keyspace(&other, more));
        let back = restore::recover(Some(&Arc::new(third)), false).expect("recovered");
        assert_eq!(back.get(b"/test/kept"), Some(b"before".to_vec()));
        assert_eq!(back.get(b"/test/after"), Some(b"after".to_vec()));
        assert!(
            back.resized(1 << 20).is_none(),
            "a restored keyspace keeps its size"
        );
    }

    #[test]
    fn a_recovery_fails_as_talos_does() {
        let failure = restore::recover(None, false).expect_err("no upload");
        assert_eq!(
            failure.error,
            "error verifying snapshot: stat /var/lib/etcd.snapshot: no such file or directory"
        );
        assert!(!failure.data_dir_written);
        let file = snapshot(&view(3, 256 << 10));
        let mut wrong = file.clone();
        let last = wrong.len() - 1;
        wrong[last] ^= 1;
        let failure = restore::recover(Some(&Arc::new(wrong.clone())), false).expect_err("hash");
        assert!(
            failure.data_dir_written,
            "etcdutl copied the database first"
        );
        assert!(restore::recover(Some(&Arc::new(wrong)), true).is_ok());
    }

    #[tokio::test]
    async fn the_stream_sends_the_snapshot_in_chunks_of_at_most_1_kib() {
        use tokio_stream::StreamExt as _;
        let v = view(9, 256 << 10);
        let whole = snapshot(&v);
        let mut stream = v.stream();
        let mut got = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.expect("chunk");
            assert!(!chunk.bytes.is_empty() && chunk.bytes.len() <= CHUNK);
            got.extend_from_slice(&chunk.bytes);
        }
        assert_eq!(got, whole);
    }
}
