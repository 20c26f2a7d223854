//! The simulated keyspace of an etcd cluster: what a Kubernetes control plane keeps in etcd
//! (`/registry/...` keys, protobuf-encoded objects with Kubernetes' `k8s\0` envelope), laid out
//! as etcd's mvcc store keeps it in the `key` bucket: one entry per revision, the revision as
//! the key and an `mvccpb.KeyValue` as the value (talos-facts §12.3).
//!
//! Deterministic from a seed (one per etcd cluster) and a target size: the same cluster always
//! yields the same entries, generated in revision order and never held all at once. The
//! history is that of a cluster compacted a while ago: the live objects at one revision each,
//! then what happened since the compaction — lease renewals (more revisions of a key) and
//! events created and deleted (tombstones).
//!
//! A cluster restored from a snapshot has instead the `key` bucket of that snapshot's database
//! as its history, read from the uploaded bytes in place (`Keyspace::restored`). Either way,
//! the keys tests write through a member come after it, at the next revisions, as etcd's mvcc
//! store writes them (`Keyspace::with_change`).

use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock};

use super::bolt;
use super::read::Db;

/// A small, fast, deterministic generator (SplitMix64).
#[derive(Debug, Clone)]
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }

    /// A number in `lo..hi` (`lo` when the range is empty).
    fn range(&mut self, lo: usize, hi: usize) -> usize {
        if hi <= lo {
            return lo;
        }
        lo + usize::try_from(self.next() % (hi - lo) as u64).unwrap_or(0)
    }
}

/// A Kubernetes object's type and the size of its body.
#[derive(Debug, Clone, Copy)]
struct Kind {
    api_version: &'static str,
    kind: &'static str,
    /// Body bytes, from..to.
    size: (usize, usize),
}

const fn kind(api_version: &'static str, kind: &'static str, lo: usize, hi: usize) -> Kind {
    Kind {
        api_version,
        kind,
        size: (lo, hi),
    }
}

const NAMESPACE: Kind = kind("v1", "Namespace", 120, 220);
const SERVICE_ACCOUNT: Kind = kind("v1", "ServiceAccount", 90, 200);
const CONFIG_MAP: Kind = kind("v1", "ConfigMap", 200, 3000);
const ROOT_CA: Kind = kind("v1", "ConfigMap", 1250, 1400);
const SECRET: Kind = kind("v1", "Secret", 300, 2500);
const SERVICE: Kind = kind("v1", "Service", 300, 600);
const ENDPOINTS: Kind = kind("v1", "Endpoints", 200, 450);
const ENDPOINT_SLICE: Kind = kind("discovery.k8s.io/v1", "EndpointSlice", 250, 500);
const POD: Kind = kind("v1", "Pod", 2500, 7000);
const NODE: Kind = kind("v1", "Node", 3000, 6000);
const EVENT: Kind = kind("v1", "Event", 400, 900);
const RANGE: Kind = kind("v1", "RangeAllocation", 60, 400);
const LEASE: Kind = kind("coordination.k8s.io/v1", "Lease", 150, 260);
const CSI_NODE: Kind = kind("storage.k8s.io/v1", "CSINode", 200, 300);
const DEPLOYMENT: Kind = kind("apps/v1", "Deployment", 1500, 3500);
const REPLICA_SET: Kind = kind("apps/v1", "ReplicaSet", 1500, 3000);
const DAEMON_SET: Kind = kind("apps/v1", "DaemonSet", 2000, 4000);
const CLUSTER_ROLE: Kind = kind("rbac.authorization.k8s.io/v1", "ClusterRole", 200, 1800);
const CLUSTER_ROLE_BINDING: Kind = kind(
    "rbac.authorization.k8s.io/v1",
    "ClusterRoleBinding",
    150,
    400,
);
const ROLE: Kind = kind("rbac.authorization.k8s.io/v1", "Role", 200, 900);
const ROLE_BINDING: Kind = kind("rbac.authorization.k8s.io/v1", "RoleBinding", 150, 400);
const API_SERVICE: Kind = kind("apiregistration.k8s.io/v1", "APIService", 250, 400);
const FLOW_SCHEMA: Kind = kind("flowcontrol.apiserver.k8s.io/v1", "FlowSchema", 400, 800);
const PRIORITY_LEVEL: Kind = kind(
    "flowcontrol.apiserver.k8s.io/v1",
    "PriorityLevelConfiguration",
    250,
    400,
);
const PRIORITY_CLASS: Kind = kind("scheduling.k8s.io/v1", "PriorityClass", 100, 150);
const CRD: Kind = kind(
    "apiextensions.k8s.io/v1",
    "CustomResourceDefinition",
    8_000,
    40_000,
);

const API_GROUPS: &[&str] = &[
    "v1.",
    "v1.admissionregistration.k8s.io",
    "v1.apiextensions.k8s.io",
    "v1.apps",
    "v1.authentication.k8s.io",
    "v1.authorization.k8s.io",
    "v1.autoscaling",
    "v2.autoscaling",
    "v1.batch",
    "v1.certificates.k8s.io",
    "v1.coordination.k8s.io",
    "v1.discovery.k8s.io",
    "v1.events.k8s.io",
    "v1.flowcontrol.apiserver.k8s.io",
    "v1.networking.k8s.io",
    "v1.node.k8s.io",
    "v1.policy",
    "v1.rbac.authorization.k8s.io",
    "v1.resource.k8s.io",
    "v1.scheduling.k8s.io",
    "v1.storage.k8s.io",
];

const FLOW_SCHEMAS: &[&str] = &[
    "catch-all",
    "endpoint-controller",
    "exempt",
    "global-default",
    "kube-controller-manager",
    "kube-scheduler",
    "kube-system-service-accounts",
    "probes",
    "service-accounts",
    "system-leader-election",
    "system-node-high",
    "system-nodes",
    "workload-leader-election",
];

const PRIORITY_LEVELS: &[&str] = &[
    "catch-all",
    "exempt",
    "global-default",
    "leader-election",
    "node-high",
    "system",
    "workload-high",
    "workload-low",
];

const CLUSTER_ROLES: &[&str] = &[
    "admin",
    "cluster-admin",
    "edit",
    "view",
    "system:aggregate-to-admin",
    "system:aggregate-to-edit",
    "system:aggregate-to-view",
    "system:auth-delegator",
    "system:basic-user",
    "system:certificates.k8s.io:certificatesigningrequests:nodeclient",
    "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient",
    "system:discovery",
    "system:heapster",
    "system:kube-aggregator",
    "system:kube-controller-manager",
    "system:kube-dns",
    "system:kube-scheduler",
    "system:kubelet-api-admin",
    "system:monitoring",
    "system:node",
    "system:node-bootstrapper",
    "system:node-problem-detector",
    "system:node-proxier",
    "system:persistent-volume-provisioner",
    "system:public-info-viewer",
    "system:service-account-issuer-discovery",
    "system:volume-scheduler",
    "system:controller:attachdetach-controller",
    "system:controller:certificate-controller",
    "system:controller:clusterrole-aggregation-controller",
    "system:controller:cronjob-controller",
    "system:controller:daemon-set-controller",
    "system:controller:deployment-controller",
    "system:controller:disruption-controller",
    "system:controller:endpoint-controller",
    "system:controller:endpointslice-controller",
    "system:controller:ephemeral-volume-controller",
    "system:controller:expand-controller",
    "system:controller:generic-garbage-collector",
    "system:controller:horizontal-pod-autoscaler",
    "system:controller:job-controller",
    "system:controller:namespace-controller",
    "system:controller:node-controller",
    "system:controller:persistent-volume-binder",
    "system:controller:pod-garbage-collector",
    "system:controller:pv-protection-controller",
    "system:controller:pvc-protection-controller",
    "system:controller:replicaset-controller",
    "system:controller:replication-controller",
    "system:controller:resourcequota-controller",
    "system:controller:route-controller",
    "system:controller:service-account-controller",
    "system:controller:service-controller",
    "system:controller:statefulset-controller",
    "system:controller:ttl-after-finished-controller",
    "system:controller:ttl-controller",
    "flannel",
];

const SYSTEM_ACCOUNTS: &[&str] = &[
    "attachdetach-controller",
    "bootstrap-signer",
    "certificate-controller",
    "clusterrole-aggregation-controller",
    "coredns",
    "cronjob-controller",
    "daemon-set-controller",
    "default",
    "deployment-controller",
    "disruption-controller",
    "endpoint-controller",
    "endpointslice-controller",
    "ephemeral-volume-controller",
    "expand-controller",
    "flannel",
    "generic-garbage-collector",
    "horizontal-pod-autoscaler",
    "job-controller",
    "kube-proxy",
    "namespace-controller",
    "node-controller",
    "persistent-volume-binder",
    "pod-garbage-collector",
    "pv-protection-controller",
    "pvc-protection-controller",
    "replicaset-controller",
    "replication-controller",
    "resourcequota-controller",
    "root-ca-cert-publisher",
    "service-account-controller",
    "statefulset-controller",
    "token-cleaner",
    "ttl-after-finished-controller",
    "ttl-controller",
];

/// How the key bucket's value of an entry is made.
#[derive(Debug, Clone)]
enum Body {
    /// A Kubernetes object of this kind, with a body of this many bytes.
    Object {
        kind: Kind,
        name: String,
        namespace: String,
        len: usize,
    },
    /// Plain bytes (`compact_rev_key` holds a decimal revision; a test's write).
    Plain(Vec<u8>),
    /// A deletion: the value holds only the key.
    Tombstone,
    /// An entry read from a restored database: its revision key and `KeyValue`, as stored.
    Stored { rev_key: Vec<u8>, kv: Vec<u8> },
}

/// One entry of the key bucket.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    /// The main revision (each Kubernetes write is its own transaction: sub revision 0).
    rev: i64,
    key: Vec<u8>,
    create: i64,
    version: i64,
    lease: i64,
    body: Body,
}

impl Record {
    /// The revision key etcd writes: 8 bytes main, `_`, 8 bytes sub, and `t` for a tombstone.
    pub(crate) fn revision_key(&self) -> Vec<u8> {
        if let Body::Stored { rev_key, .. } = &self.body {
            return rev_key.clone();
        }
        let mut out = Vec::with_capacity(18);
        out.extend_from_slice(&(self.rev as u64).to_be_bytes());
        out.push(b'_');
        out.extend_from_slice(&0u64.to_be_bytes());
        if self.is_tombstone() {
            out.push(b't');
        }
        out
    }

    /// Whether this revision deletes its key (etcd marks the revision key with `t`).
    fn is_tombstone(&self) -> bool {
        match &self.body {
            Body::Tombstone => true,
            Body::Stored { rev_key, .. } => is_tombstone(rev_key),
            _ => false,
        }
    }

    /// The length of [`Record::value`], without making it.
    pub(crate) fn value_len(&self) -> usize {
        self.encode(None, 0)
    }

    /// The `mvccpb.KeyValue` etcd stores for this revision; object bodies are filled from `seed`.
    pub(crate) fn value(&self, seed: u64) -> Vec<u8> {
        let mut out = Vec::with_capacity(self.value_len());
        self.encode(Some(&mut out), seed);
        out
    }

    /// Encodes the KeyValue into `out` (or only measures it), returning its length.
    fn encode(&self, mut out: Option<&mut Vec<u8>>, seed: u64) -> usize {
        if let Body::Stored { kv, .. } = &self.body {
            if let Some(out) = out {
                out.extend_from_slice(kv);
            }
            return kv.len();
        }
        let key = self.key.as_slice();
        if matches!(self.body, Body::Tombstone) {
            // etcd's delete writes `KeyValue{Key: key}` under the tombstone revision.
            if let Some(out) = out.as_deref_mut() {
                put_bytes(out, 1, key);
            }
            return field_len(key.len());
        }
        let value_len = match &self.body {
            Body::Object {
                kind,
                name,
                namespace,
                len,
            } => object_len(kind, name, namespace, *len),
            Body::Plain(bytes) => bytes.len(),
            Body::Tombstone | Body::Stored { .. } => 0,
        };
        let ints = [
            (2u8, self.create),
            (3, self.rev),
            (4, self.version),
            (6, self.lease),
        ];
        let total = field_len(key.len())
            + field_len(value_len)
            + ints
                .iter()
                .filter(|(_, v)| *v != 0)
                .map(|(_, v)| 1 + varint_len(*v as u64))
                .sum::<usize>();
        if let Some(out) = out {
            put_bytes(out, 1, key);
            for (tag, v) in &ints[..3] {
                put_int(out, *tag, *v);
            }
            put_tag_len(out, 5, value_len);
            match &self.body {
                Body::Object {
                    kind,
                    name,
                    namespace,
                    len,
                } => write_object(out, kind, name, namespace, *len, seed ^ self.rev as u64),
                Body::Plain(bytes) => out.extend_from_slice(bytes),
                Body::Tombstone | Body::Stored { .. } => {}
            }
            put_int(out, 6, self.lease);
        }
        total
    }
}

fn varint_len(mut v: u64) -> usize {
    let mut n = 1;
    while v >= 0x80 {
        v >>= 7;
        n += 1;
    }
    n
}

fn put_varint(out: &mut Vec<u8>, mut v: u64) {
    while v >= 0x80 {
        out.push((v as u8) | 0x80);
        v >>= 7;
    }
    out.push(v as u8);
}

/// A length-delimited field (tags below 16: one byte) of `len` bytes, tag and length included.
fn field_len(len: usize) -> usize {
    1 + varint_len(len as u64) + len
}

fn put_tag_len(out: &mut Vec<u8>, tag: u8, len: usize) {
    out.push(tag << 3 | 2);
    put_varint(out, len as u64);
}

fn put_bytes(out: &mut Vec<u8>, tag: u8, bytes: &[u8]) {
    put_tag_len(out, tag, bytes.len());
    out.extend_from_slice(bytes);
}

/// A non-zero integer field (proto3 leaves zeros out).
fn put_int(out: &mut Vec<u8>, tag: u8, v: i64) {
    if v != 0 {
        out.push(tag << 3);
        put_varint(out, v as u64);
    }
}

const UID_LEN: usize = 36;

fn meta_len(name: &str, namespace: &str) -> usize {
    field_len(name.len())
        + if namespace.is_empty() {
            0
        } else {
            field_len(namespace.len())
        }
        + field_len(UID_LEN)
}

/// The stored bytes of an object: Kubernetes' `k8s\0` magic and a `runtime.Unknown` holding
/// the type, the raw object (metadata: name, namespace, uid; then the body) and the empty
/// content encoding and type.
fn object_len(kind: &Kind, name: &str, namespace: &str, len: usize) -> usize {
    let raw = field_len(meta_len(name, namespace)) + field_len(len);
    let type_meta = field_len(kind.api_version.len()) + field_len(kind.kind.len());
    4 + field_len(type_meta) + field_len(raw) + 2 + 2
}

fn write_object(
    out: &mut Vec<u8>,
    kind: &Kind,
    name: &str,
    namespace: &str,
    len: usize,
    seed: u64,
) {
    let mut rng = Rng(seed);
    out.extend_from_slice(b"k8s\0");
    let type_meta = field_len(kind.api_version.len()) + field_len(kind.kind.len());
    put_tag_len(out, 1, type_meta);
    put_bytes(out, 1, kind.api_version.as_bytes());
    put_bytes(out, 2, kind.kind.as_bytes());
    let meta = meta_len(name, namespace);
    put_tag_len(out, 2, field_len(meta) + field_len(len));
    put_tag_len(out, 1, meta);
    put_bytes(out, 1, name.as_bytes());
    if !namespace.is_empty() {
        put_bytes(out, 3, namespace.as_bytes());
    }
    let (a, b) = (rng.next(), rng.next());
    let uid = format!(
        "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
        a >> 32,
        (a >> 16) & 0xffff,
        a & 0xfff,
        (b >> 48) & 0x3fff | 0x8000,
        b & 0xffff_ffff_ffff
    );
    put_bytes(out, 5, uid.as_bytes());
    put_tag_len(out, 2, len);
    let start = out.len();
    out.resize(start + len, 0);
    for chunk in out[start..].chunks_mut(8) {
        let word = rng.next().to_le_bytes();
        chunk.copy_from_slice(&word[..chunk.len()]);
    }
    out.extend_from_slice(&[0x1a, 0, 0x22, 0]);
}

/// The key the apiserver's compaction bookkeeping lives under.
const COMPACT_REV_KEY: &[u8] = b"compact_rev_key";

/// How long the lease the simulated events hold lives (the apiserver's event TTL, one hour,
/// and etcd's minimum extra).
const EVENT_LEASE_TTL: u64 = 3660;

/// What a keyspace amounts to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    /// Distinct live keys (what `etcdutl snapshot status` calls total keys).
    pub(crate) keys: usize,
    /// Entries in the key bucket (revisions kept, tombstones included).
    pub(crate) entries: usize,
    /// The latest revision.
    pub(crate) revision: i64,
}

/// A restored database's history: its `key` bucket read in place, and what etcd keeps of it
/// besides (its leases, its compaction revisions).
#[derive(Debug)]
struct Restored {
    /// The uploaded file (the database, then its trailer if it had one).
    file: Arc<Vec<u8>>,
    /// The `lease` bucket's entries.
    leases: Vec<(Vec<u8>, Vec<u8>)>,
    /// The `meta` bucket's `finishedCompactRev` and `scheduledCompactRev`, those present.
    compaction: Vec<(Vec<u8>, Vec<u8>)>,
}

/// Where a keyspace's history comes from.
#[derive(Debug)]
enum Source {
    /// Generated from a seed (the cluster's id), making a database of about `size` bytes.
    Generated { seed: u64, size: u64 },
    /// Restored from a snapshot.
    Restored(Restored),
}

/// A change a test made through a member, after the history: a put, or a delete (`None`) of
/// a key that was live.
#[derive(Debug, Clone)]
struct Change {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
}

/// The simulated data of one etcd cluster: immutable (a change makes a new keyspace that
/// shares the history), so a snapshot streams one consistent state.
#[derive(Debug)]
pub(crate) struct Keyspace {
    source: Arc<Source>,
    changes: Vec<Change>,
    summary: OnceLock<Summary>,
    /// Database sizes already computed, by the rest of the database they were computed with.
    db_sizes: Mutex<BTreeMap<String, u64>>,
}

/// Pages the cluster-wide buckets and branch pages take besides the key bucket's leaves.
const OVERHEAD_PAGES: u64 = 8;

/// The 17-byte revision etcd stores compaction revisions as (main, `_`, sub 0).
fn revision_bytes(main: i64) -> Vec<u8> {
    let mut out = (main as u64).to_be_bytes().to_vec();
    out.push(b'_');
    out.extend_from_slice(&0u64.to_be_bytes());
    out
}

/// Whether a revision key marks a deletion (etcd's `mvcc.IsTombstone`: 18 bytes ending `t`).
pub(crate) fn is_tombstone(rev_key: &[u8]) -> bool {
    rev_key.len() == 18 && rev_key[17] == b't'
}

impl Keyspace {
    fn with_source(source: Arc<Source>, changes: Vec<Change>) -> Self {
        Self {
            source,
            changes,
            summary: OnceLock::new(),
            db_sizes: Mutex::new(BTreeMap::new()),
        }
    }

    /// The keyspace of the cluster with this seed, making a database of about `size` bytes
    /// (never less than a fresh cluster's objects).
    pub(crate) fn new(seed: u64, size: u64) -> Self {
        Self::with_source(Arc::new(Source::Generated { seed, size }), Vec::new())
    }

    /// The keyspace of a database restored from `file` (checked before: see `restore`): its
    /// `key` bucket, leases and compaction revisions, read in place.
    pub(crate) fn restored(file: Arc<Vec<u8>>) -> Result<Self, String> {
        let db = Db::open(&file)?;
        let leases = super::read::small_bucket(&db, b"lease")?
            .into_iter()
            .collect();
        let compaction = super::read::small_bucket(&db, b"meta")?
            .into_iter()
            .filter(|(k, _)| k == b"finishedCompactRev" || k == b"scheduledCompactRev")
            .collect();
        let restored = Restored {
            file: Arc::clone(&file),
            leases,
            compaction,
        };
        Ok(Self::with_source(
            Arc::new(Source::Restored(restored)),
            Vec::new(),
        ))
    }

    /// The same history, resized to about `size` bytes (a generated one only: a restored one
    /// is the snapshot's size). The changes made since stay on top.
    pub(crate) fn resized(&self, size: u64) -> Option<Self> {
        match self.source.as_ref() {
            Source::Generated { seed, .. } => Some(Self::with_source(
                Arc::new(Source::Generated { seed: *seed, size }),
                self.changes.clone(),
            )),
            Source::Restored(_) => None,
        }
    }

    /// This keyspace with `key` put to `value`, or deleted (`None`): the next revision, as a
    /// member's put or delete writes it. Returns the new keyspace and its revision; a delete
    /// of a key that is not live changes nothing (etcd writes no revision for it).
    pub(crate) fn with_change(&self, key: &[u8], value: Option<Vec<u8>>) -> Option<(Self, i64)> {
        if value.is_none() && self.get(key).is_none() {
            return None;
        }
        let mut changes = self.changes.clone();
        changes.push(Change {
            key: key.to_vec(),
            value,
        });
        let revision = self.summary().revision + 1;
        Some((
            Self::with_source(Arc::clone(&self.source), changes),
            revision,
        ))
    }

    /// The value of `key` at the latest revision, `None` when it is not live.
    pub(crate) fn get(&self, key: &[u8]) -> Option<Vec<u8>> {
        let mut last: Option<Record> = None;
        let _ = self.generate(&mut |r| {
            if r.key == key {
                last = Some(r.clone());
            }
            Ok(())
        });
        let record = last.filter(|r| !r.is_tombstone())?;
        let kv = record.value(self.seed());
        KeyValue::parse(&kv).ok().map(|kv| kv.value.to_vec())
    }

    /// The seed object bodies are filled from.
    fn seed(&self) -> u64 {
        match self.source.as_ref() {
            Source::Generated { seed, .. } => *seed,
            Source::Restored(_) => 0,
        }
    }

    /// The database size computed by `compute` for this keyspace and the rest of the
    /// database `with` describes, computed once.
    pub(crate) fn db_size(&self, with: String, compute: impl FnOnce() -> u64) -> u64 {
        if let Some(size) = self
            .db_sizes
            .lock()
            .ok()
            .and_then(|s| s.get(&with).copied())
        {
            return size;
        }
        let size = compute();
        if let Ok(mut sizes) = self.db_sizes.lock() {
            sizes.insert(with, size);
        }
        size
    }

    /// Counts, computed once.
    pub(crate) fn summary(&self) -> Summary {
        *self.summary.get_or_init(|| {
            let mut keys = BTreeMap::<Vec<u8>, bool>::new();
            let mut summary = Summary {
                keys: 0,
                entries: 0,
                revision: 0,
            };
            let _ = self.generate(&mut |r| {
                summary.entries += 1;
                summary.revision = r.rev;
                keys.insert(r.key.clone(), !r.is_tombstone());
                Ok(())
            });
            summary.keys = keys.values().filter(|live| **live).count();
            summary
        })
    }

    /// The `lease` bucket's entries: the lease the generated events hold
    /// (`leasepb.Lease{ID, TTL}` under the big-endian id), or a restored database's leases.
    pub(crate) fn leases(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self.source.as_ref() {
            Source::Generated { seed, .. } => {
                let id = event_lease(*seed);
                let mut lease = vec![0x08];
                put_varint(&mut lease, id as u64);
                lease.push(0x10);
                put_varint(&mut lease, EVENT_LEASE_TTL);
                vec![((id as u64).to_be_bytes().to_vec(), lease)]
            }
            Source::Restored(r) => r.leases.clone(),
        }
    }

    /// The `meta` bucket's compaction revisions (`finishedCompactRev`, `scheduledCompactRev`):
    /// the generated history's last compaction, or a restored database's.
    pub(crate) fn compaction(&self) -> Vec<(Vec<u8>, Vec<u8>)> {
        match self.source.as_ref() {
            Source::Generated { .. } => {
                let mut compacted = 0;
                let _ = self.generate_source(&mut |r| {
                    if r.key == COMPACT_REV_KEY {
                        compacted = r.rev - 1;
                    }
                    Ok(())
                });
                let rev = revision_bytes(compacted);
                vec![
                    (b"finishedCompactRev".to_vec(), rev.clone()),
                    (b"scheduledCompactRev".to_vec(), rev),
                ]
            }
            Source::Restored(r) => r.compaction.clone(),
        }
    }

    /// Generates every record in revision order: the history, then the changes.
    pub(crate) fn generate(
        &self,
        visit: &mut dyn FnMut(&Record) -> io::Result<()>,
    ) -> io::Result<()> {
        // What the history says of each changed key: its creation, version, liveness.
        let mut state: BTreeMap<&[u8], (i64, i64, bool)> = self
            .changes
            .iter()
            .map(|c| (c.key.as_slice(), (0, 0, false)))
            .collect();
        let mut last = 0;
        self.generate_source(&mut |r| {
            last = r.rev;
            if let Some(entry) = state.get_mut(r.key.as_slice()) {
                *entry = (r.create, r.version, !r.is_tombstone());
            }
            visit(r)
        })?;
        let mut rev = last;
        for change in &self.changes {
            let entry = state
                .get_mut(change.key.as_slice())
                .ok_or_else(|| io::Error::other("a change of an untracked key"))?;
            let (create, version, live) = *entry;
            let record = match &change.value {
                Some(value) => {
                    rev += 1;
                    let (create, version) = if live {
                        (create, version + 1)
                    } else {
                        (rev, 1)
                    };
                    *entry = (create, version, true);
                    Record {
                        rev,
                        key: change.key.clone(),
                        create,
                        version,
                        lease: 0,
                        body: Body::Plain(value.clone()),
                    }
                }
                // The history changed under a delete (a resize): nothing to delete.
                None if !live => continue,
                None => {
                    rev += 1;
                    *entry = (0, 0, false);
                    Record {
                        rev,
                        key: change.key.clone(),
                        create: 0,
                        version: 0,
                        lease: 0,
                        body: Body::Tombstone,
                    }
                }
            };
            visit(&record)?;
        }
        Ok(())
    }

    /// Generates the history's records in revision order.
    fn generate_source(&self, visit: &mut dyn FnMut(&Record) -> io::Result<()>) -> io::Result<()> {
        match self.source.as_ref() {
            Source::Generated { seed, size } => generate(*seed, *size, visit),
            Source::Restored(restored) => restored.generate(visit),
        }
    }
}

impl Restored {
    /// The `key` bucket's entries, decoded as etcd's mvcc store reads them.
    fn generate(&self, visit: &mut dyn FnMut(&Record) -> io::Result<()>) -> io::Result<()> {
        let db = Db::open(&self.file).map_err(io::Error::other)?;
        let Some(bucket) = db.bucket(b"key").map_err(io::Error::other)? else {
            return Ok(());
        };
        let mut failed: Option<io::Error> = None;
        let walked = db.entries(bucket, &mut |(_, k, v)| {
            let kv = KeyValue::parse(v).map_err(|()| format!("entry {k:02x?}: not a KeyValue"))?;
            let main = k
                .get(..8)
                .and_then(|b| b.try_into().ok())
                .map(u64::from_be_bytes)
                .ok_or_else(|| format!("entry {k:02x?}: not a revision"))?;
            let record = Record {
                rev: i64::try_from(main).unwrap_or(i64::MAX),
                key: kv.key.to_vec(),
                create: kv.create,
                version: kv.version,
                lease: kv.lease,
                body: Body::Stored {
                    rev_key: k.to_vec(),
                    kv: v.to_vec(),
                },
            };
            visit(&record).map_err(|e| {
                let message = e.to_string();
                failed = Some(e);
                message
            })
        });
        match (walked, failed) {
            (_, Some(e)) => Err(e),
            (Err(e), None) => Err(io::Error::other(e)),
            (Ok(()), None) => Ok(()),
        }
    }
}

/// The lease the events of a generated keyspace hold (etcd lease ids are positive int64s).
fn event_lease(seed: u64) -> i64 {
    i64::try_from(Rng(seed ^ 0x1ea5e).next() >> 2).unwrap_or(1) | 1
}

/// Generates a keyspace's records in revision order: a fresh cluster, applications up to about
/// `size` bytes, then what happened since the last compaction.
fn generate(
    seed: u64,
    size: u64,
    visit: &mut dyn FnMut(&Record) -> io::Result<()>,
) -> io::Result<()> {
    let mut g = Generator {
        rng: Rng(seed),
        rev: 1,
        visit,
        pages: bolt::PageCount::default(),
        leases: Vec::new(),
    };
    g.fresh_cluster(seed)?;
    let budget = size / bolt::PAGE as u64;
    let mut app = 0usize;
    // Tail and branch pages come on top of the leaves counted here.
    while g.pages.pages() + g.pages.pages() / 100 + OVERHEAD_PAGES + 12 < budget {
        g.application(app)?;
        app += 1;
    }
    g.since_compaction(event_lease(seed))
}

/// The fields of an `mvccpb.KeyValue` (etcd's `api/mvccpb/kv.proto`): `key` 1, `create_revision`
/// 2, `mod_revision` 3, `version` 4, `value` 5, `lease` 6.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct KeyValue<'a> {
    pub(crate) key: &'a [u8],
    pub(crate) create: i64,
    pub(crate) modified: i64,
    pub(crate) version: i64,
    pub(crate) value: &'a [u8],
    pub(crate) lease: i64,
}

impl<'a> KeyValue<'a> {
    /// Decodes a `KeyValue` as Go's protobuf unmarshals one: any well-formed wire data (fields
    /// of another number or wire type are skipped as unknown, the last of a field wins), and
    /// an error for malformed data (a truncated or over-long varint, a length past the end,
    /// field number 0, wire types 6 and 7, an unmatched group end).
    pub(crate) fn parse(bytes: &'a [u8]) -> Result<Self, ()> {
        let mut kv = Self::default();
        let mut at = 0;
        while at < bytes.len() {
            let tag = varint(bytes, &mut at)?;
            let (number, wire) = (tag >> 3, tag & 7);
            if number == 0 || number > (1 << 29) - 1 {
                return Err(());
            }
            match wire {
                0 => {
                    let v = varint(bytes, &mut at)? as i64;
                    match number {
                        2 => kv.create = v,
                        3 => kv.modified = v,
                        4 => kv.version = v,
                        6 => kv.lease = v,
                        _ => {}
                    }
                }
                2 => {
                    let len = usize::try_from(varint(bytes, &mut at)?).map_err(|_| ())?;
                    let field = bytes.get(at..at.checked_add(len).ok_or(())?).ok_or(())?;
                    at += len;
                    match number {
                        1 => kv.key = field,
                        5 => kv.value = field,
                        _ => {}
                    }
                }
                1 | 5 => {
                    at += if wire == 1 { 8 } else { 4 };
                    if at > bytes.len() {
                        return Err(());
                    }
                }
                3 => skip_group(bytes, &mut at, number)?,
                _ => return Err(()),
            }
        }
        Ok(kv)
    }
}

/// Reads a varint as Go's `protowire.ConsumeVarint` does (at most 10 bytes, the tenth 0 or 1).
fn varint(bytes: &[u8], at: &mut usize) -> Result<u64, ()> {
    let mut v = 0u64;
    for i in 0..10 {
        let b = *bytes.get(*at).ok_or(())?;
        *at += 1;
        if i == 9 && b > 1 {
            return Err(());
        }
        v |= u64::from(b & 0x7f) << (7 * i);
        if b < 0x80 {
            return Ok(v);
        }
    }
    Err(())
}

/// Skips an unknown group up to its matching end.
fn skip_group(bytes: &[u8], at: &mut usize, number: u64) -> Result<(), ()> {
    loop {
        let tag = varint(bytes, at)?;
        let (n, wire) = (tag >> 3, tag & 7);
        if n == 0 {
            return Err(());
        }
        match wire {
            0 => {
                varint(bytes, at)?;
            }
            1 | 5 => {
                *at += if wire == 1 { 8 } else { 4 };
                if *at > bytes.len() {
                    return Err(());
                }
            }
            2 => {
                let len = usize::try_from(varint(bytes, at)?).map_err(|_| ())?;
                *at = at.checked_add(len).ok_or(())?;
                if *at > bytes.len() {
                    return Err(());
                }
            }
            3 => skip_group(bytes, at, n)?,
            4 if n == number => return Ok(()),
            _ => return Err(()),
        }
    }
}

/// The state of one generation pass.
struct Generator<'v> {
    rng: Rng,
    rev: i64,
    visit: &'v mut dyn FnMut(&Record) -> io::Result<()>,
    pages: bolt::PageCount,
    /// Leases renewed after the compaction: key, kind, name, namespace, created at.
    leases: Vec<(String, String, String, i64)>,
}

impl Generator<'_> {
    fn emit(&mut self, record: &Record) -> io::Result<()> {
        self.pages.push(&record.revision_key(), record.value_len());
        (self.visit)(record)
    }

    /// Writes an object at the next revision; objects that were updated since they were
    /// created (their older revisions compacted away) get a higher version.
    fn object(
        &mut self,
        key: String,
        kind: Kind,
        name: &str,
        namespace: &str,
        updates: usize,
    ) -> io::Result<i64> {
        self.rev += 1 + i64::try_from(self.rng.range(0, 3)).unwrap_or(0);
        let version = 1 + self.rng.range(0, updates + 1) as i64;
        let create = if version > 1 {
            (self.rev - i64::try_from(self.rng.range(1, 40)).unwrap_or(1)).max(2)
        } else {
            self.rev
        };
        let len = self.rng.range(kind.size.0, kind.size.1);
        let record = Record {
            rev: self.rev,
            key: key.into_bytes(),
            create,
            version,
            lease: 0,
            body: Body::Object {
                kind,
                name: name.to_owned(),
                namespace: namespace.to_owned(),
                len,
            },
        };
        self.emit(&record)?;
        Ok(create)
    }

    fn put(
        &mut self,
        resource: &str,
        kind: Kind,
        namespace: &str,
        name: &str,
        updates: usize,
    ) -> io::Result<i64> {
        let key = if namespace.is_empty() {
            format!("/registry/{resource}/{name}")
        } else {
            format!("/registry/{resource}/{namespace}/{name}")
        };
        self.object(key, kind, name, namespace, updates)
    }

    fn hex(&mut self, n: usize) -> String {
        let v = self.rng.next();
        format!("{v:016x}")[..n.min(16)].to_owned()
    }

    /// What a new Talos-made Kubernetes cluster holds: API services, RBAC, flow control,
    /// system namespaces and accounts, CoreDNS, kube-proxy, flannel, nodes and their leases.
    fn fresh_cluster(&mut self, seed: u64) -> io::Result<()> {
        for ns in ["default", "kube-node-lease", "kube-public", "kube-system"] {
            self.put("namespaces", NAMESPACE, "", ns, 0)?;
        }
        self.put("ranges", RANGE, "", "serviceips", 3)?;
        self.put("ranges", RANGE, "", "servicenodeports", 0)?;
        for group in API_GROUPS {
            self.put(
                "apiregistration.k8s.io/apiservices",
                API_SERVICE,
                "",
                group,
                1,
            )?;
        }
        for name in ["system-cluster-critical", "system-node-critical"] {
            self.put("priorityclasses", PRIORITY_CLASS, "", name, 0)?;
        }
        for name in FLOW_SCHEMAS {
            self.put("flowschemas", FLOW_SCHEMA, "", name, 2)?;
        }
        for name in PRIORITY_LEVELS {
            self.put("prioritylevelconfigurations", PRIORITY_LEVEL, "", name, 2)?;
        }
        for name in CLUSTER_ROLES {
            self.put("clusterroles", CLUSTER_ROLE, "", name, 0)?;
            self.put("clusterrolebindings", CLUSTER_ROLE_BINDING, "", name, 0)?;
        }
        for name in [
            "extension-apiserver-authentication-reader",
            "system::leader-locking-kube-controller-manager",
            "system::leader-locking-kube-scheduler",
            "system:controller:bootstrap-signer",
            "system:controller:cloud-provider",
            "system:controller:token-cleaner",
        ] {
            self.put("roles", ROLE, "kube-system", name, 0)?;
            self.put("rolebindings", ROLE_BINDING, "kube-system", name, 0)?;
        }
        for ns in ["default", "kube-node-lease", "kube-public", "kube-system"] {
            self.put("serviceaccounts", SERVICE_ACCOUNT, ns, "default", 0)?;
            self.put("configmaps", ROOT_CA, ns, "kube-root-ca.crt", 0)?;
        }
        for name in SYSTEM_ACCOUNTS.iter().filter(|n| **n != "default") {
            self.put("serviceaccounts", SERVICE_ACCOUNT, "kube-system", name, 0)?;
        }
        for name in [
            "coredns",
            "extension-apiserver-authentication",
            "kube-apiserver-legacy-service-account-token-tracking",
            "kube-flannel-cfg",
            "kube-proxy",
        ] {
            self.put("configmaps", CONFIG_MAP, "kube-system", name, 1)?;
        }
        self.put("services/specs", SERVICE, "default", "kubernetes", 0)?;
        self.put("services/specs", SERVICE, "kube-system", "kube-dns", 0)?;
        self.put("services/endpoints", ENDPOINTS, "default", "kubernetes", 2)?;
        self.put(
            "services/endpoints",
            ENDPOINTS,
            "kube-system",
            "kube-dns",
            4,
        )?;
        self.put("endpointslices", ENDPOINT_SLICE, "default", "kubernetes", 2)?;
        let dns = format!("kube-dns-{}", self.hex(5));
        self.put("endpointslices", ENDPOINT_SLICE, "kube-system", &dns, 4)?;
        self.put("deployments", DEPLOYMENT, "kube-system", "coredns", 4)?;
        let rs = format!("coredns-{}", self.hex(10));
        self.put("replicasets", REPLICA_SET, "kube-system", &rs, 3)?;
        for daemon in ["kube-flannel", "kube-proxy"] {
            self.put("daemonsets", DAEMON_SET, "kube-system", daemon, 6)?;
        }
        let mut nodes = Vec::new();
        let mut names = Rng(seed ^ 0x6e0de5);
        for i in 0..5 {
            let word = names.next();
            let name = format!("talos-{:03x}-{:03x}", word & 0xfff, (word >> 12) & 0xfff);
            nodes.push((name, i < 3));
        }
        for (node, control_plane) in &nodes {
            self.put("minions", NODE, "", node, 8)?;
            self.put("csinodes", CSI_NODE, "", node, 0)?;
            for daemon in ["kube-flannel-ds", "kube-proxy"] {
                let pod = format!("{daemon}-{}", self.hex(5));
                self.put("pods", POD, "kube-system", &pod, 4)?;
            }
            if *control_plane {
                for component in [
                    "kube-apiserver",
                    "kube-controller-manager",
                    "kube-scheduler",
                ] {
                    let pod = format!("{component}-{node}");
                    self.put("pods", POD, "kube-system", &pod, 4)?;
                }
            }
            let lease = format!("/registry/leases/kube-node-lease/{node}");
            let created = self.object(lease.clone(), LEASE, node, "kube-node-lease", 30)?;
            self.leases
                .push((lease, node.clone(), "kube-node-lease".into(), created));
        }
        for i in 0..2 {
            let pod = format!("{rs}-{}", self.hex(5));
            let _ = i;
            self.put("pods", POD, "kube-system", &pod, 3)?;
        }
        let apiserver = format!("apiserver-{}", self.hex(16));
        for name in [
            "kube-controller-manager",
            "kube-scheduler",
            apiserver.as_str(),
        ] {
            let lease = format!("/registry/leases/kube-system/{name}");
            let created = self.object(lease.clone(), LEASE, name, "kube-system", 30)?;
            self.leases
                .push((lease, name.to_owned(), "kube-system".into(), created));
        }
        Ok(())
    }

    /// One application namespace: its namespace objects, a few deployments with their
    /// replica sets, pods and services, configuration, and now and then a custom resource
    /// definition (large: it takes overflow pages).
    fn application(&mut self, app: usize) -> io::Result<()> {
        let ns = format!("app-{app:04}");
        self.put("namespaces", NAMESPACE, "", &ns, 0)?;
        self.put("serviceaccounts", SERVICE_ACCOUNT, &ns, "default", 0)?;
        self.put("configmaps", ROOT_CA, &ns, "kube-root-ca.crt", 0)?;
        self.put("rolebindings", ROLE_BINDING, &ns, "deployer", 0)?;
        if app % 8 == 7 {
            let crd = format!("widgets{app}.example.com");
            self.put(
                "apiextensions.k8s.io/customresourcedefinitions",
                CRD,
                "",
                &crd,
                2,
            )?;
        }
        for d in 0..self.rng.range(1, 5) {
            let name = format!("service-{d}");
            self.put("deployments", DEPLOYMENT, &ns, &name, 3)?;
            let rs = format!("{name}-{}", self.hex(10));
            self.put("replicasets", REPLICA_SET, &ns, &rs, 2)?;
            for _ in 0..self.rng.range(1, 4) {
                let pod = format!("{rs}-{}", self.hex(5));
                self.put("pods", POD, &ns, &pod, 4)?;
            }
            self.put("services/specs", SERVICE, &ns, &name, 0)?;
            self.put("services/endpoints", ENDPOINTS, &ns, &name, 2)?;
            let slice = format!("{name}-{}", self.hex(5));
            self.put("endpointslices", ENDPOINT_SLICE, &ns, &slice, 2)?;
            let config = format!("{name}-config");
            self.put("configmaps", CONFIG_MAP, &ns, &config, 1)?;
            let secret = format!("{name}-credentials");
            self.put("secrets", SECRET, &ns, &secret, 0)?;
        }
        Ok(())
    }

    /// What happened since the last compaction: the apiserver's compaction bookkeeping, lease
    /// renewals, and events (held by a lease) created, most of them deleted again.
    fn since_compaction(&mut self, event_lease: i64) -> io::Result<()> {
        let compacted = self.rev;
        self.rev += 1;
        let record = Record {
            rev: self.rev,
            key: COMPACT_REV_KEY.to_vec(),
            create: 2,
            version: 1 + i64::try_from(self.rng.range(5, 60)).unwrap_or(5),
            lease: 0,
            body: Body::Plain(compacted.to_string().into_bytes()),
        };
        self.emit(&record)?;
        let leases = std::mem::take(&mut self.leases);
        let mut versions = vec![31i64; leases.len()];
        for _round in 0..3 {
            for ((key, name, namespace, created), version) in leases.iter().zip(versions.iter_mut())
            {
                self.rev += 1;
                *version += 1;
                let record = Record {
                    rev: self.rev,
                    key: key.clone().into_bytes(),
                    create: *created,
                    version: *version,
                    lease: 0,
                    body: Body::Object {
                        kind: LEASE,
                        name: name.clone(),
                        namespace: namespace.clone(),
                        len: self.rng.range(LEASE.size.0, LEASE.size.1),
                    },
                };
                self.emit(&record)?;
            }
        }
        let mut events = Vec::new();
        for _ in 0..24 {
            self.rev += 1;
            let name = format!("coredns.{}", self.hex(16));
            let key = format!("/registry/events/kube-system/{name}");
            let record = Record {
                rev: self.rev,
                key: key.clone().into_bytes(),
                create: self.rev,
                version: 1,
                lease: event_lease,
                body: Body::Object {
                    kind: EVENT,
                    name,
                    namespace: "kube-system".into(),
                    len: self.rng.range(EVENT.size.0, EVENT.size.1),
                },
            };
            self.emit(&record)?;
            events.push(key);
        }
        for key in events.into_iter().take(16) {
            self.rev += 1;
            let record = Record {
                rev: self.rev,
                key: key.into_bytes(),
                create: 0,
                version: 0,
                lease: 0,
                body: Body::Tombstone,
            };
            self.emit(&record)?;
        }
        Ok(())
    }
}

/// The key bucket of a keyspace, for the bbolt writer.
impl bolt::Entries for Keyspace {
    fn sizes(&self, visit: &mut dyn FnMut(&[u8], usize)) {
        let _ = self.generate(&mut |r| {
            visit(&r.revision_key(), r.value_len());
            Ok(())
        });
    }

    fn write(&self, visit: &mut bolt::Visit<'_>) -> io::Result<()> {
        let seed = self.seed();
        self.generate(&mut |r| visit(&r.revision_key(), &r.value(seed)))
    }
}
