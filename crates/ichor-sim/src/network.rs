//! What simulated nodes know of each other, as real nodes would learn it over the network:
//! which addresses answer, which configs they run, and the etcd clusters they form. Cluster
//! membership is derived only from the applied configs (cluster identity, endpoint, token),
//! never from how a test wired the nodes (talos-facts §5).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex as StdMutex, MutexGuard};
use std::time::Duration;

use crate::config::AppliedConfig;
use crate::control::Controlled;
use crate::control::Controls;

/// What others can see of a node without taking its lock.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) addr: SocketAddr,
    pub(crate) fingerprint: StdMutex<String>,
    /// Whether its API listener is up.
    pub(crate) serving: AtomicBool,
    /// The etcd cluster whose member runs on this node (0: none).
    pub(crate) etcd_running: AtomicU64,
    pub(crate) controls: Controls,
    /// Fault: the next `EtcdLeaveCluster` (or graceful reset) fails.
    pub(crate) fail_leave: AtomicBool,
    /// Fault: its etcd member runs but answers neither its clients nor its peers.
    pub(crate) etcd_unhealthy: AtomicBool,
    /// Fault: an upgrade comes back on the old version.
    pub(crate) upgrade_rollback: AtomicBool,
    /// Fault: config changes need a reboot (`NO_REBOOT` refused).
    pub(crate) require_reboot: AtomicBool,
    /// Fault: the installer fails.
    pub(crate) install_fails: AtomicBool,
    /// Fault: the installer never finishes.
    pub(crate) install_hangs: AtomicBool,
    /// How many rounds its etcd service has begun (control planes; for tests).
    pub(crate) etcd_rounds: AtomicUsize,
    /// How many times it has begun asking trustd for its certificate (workers; for tests).
    pub(crate) trustd_attempts: AtomicUsize,
    /// How many configs it took, in maintenance mode or configured, dry runs not counted
    /// (for tests).
    pub(crate) config_applies: AtomicUsize,
    /// How many install attempts have reached their outcome: installed, failed, or hung past
    /// the install time (for tests).
    pub(crate) installs_run: AtomicUsize,
    /// The Talos version it runs (changes with upgrades).
    talos_version: StdMutex<String>,
    /// This boot's event log and boot id, readable without the node's lock (a call racing
    /// the node's shutdown must not wait for it).
    boot: StdMutex<(Arc<crate::events::EventLog>, String)>,
}

impl Shared {
    pub(crate) fn new(addr: SocketAddr, talos_version: &str) -> Self {
        Self {
            addr,
            talos_version: StdMutex::new(talos_version.to_owned()),
            fingerprint: StdMutex::new(String::new()),
            serving: AtomicBool::new(false),
            etcd_running: AtomicU64::new(0),
            controls: Controls::default(),
            fail_leave: AtomicBool::new(false),
            etcd_unhealthy: AtomicBool::new(false),
            upgrade_rollback: AtomicBool::new(false),
            require_reboot: AtomicBool::new(false),
            install_fails: AtomicBool::new(false),
            install_hangs: AtomicBool::new(false),
            etcd_rounds: AtomicUsize::new(0),
            trustd_attempts: AtomicUsize::new(0),
            config_applies: AtomicUsize::new(0),
            installs_run: AtomicUsize::new(0),
            boot: StdMutex::new((Arc::default(), String::new())),
        }
    }

    /// Records this boot's event log and boot id.
    pub(crate) fn set_boot(&self, events: Arc<crate::events::EventLog>, boot_id: String) {
        if let Ok(mut boot) = self.boot.lock() {
            *boot = (events, boot_id);
        }
    }

    /// This boot's event log and boot id.
    pub(crate) fn boot(&self) -> (Arc<crate::events::EventLog>, String) {
        self.boot
            .lock()
            .map(|b| b.clone())
            .unwrap_or_else(|e| e.into_inner().clone())
    }

    /// Whether peers can reach it: serving and not partitioned away.
    pub(crate) fn reachable(&self) -> bool {
        self.serving.load(Ordering::SeqCst) && !self.controls.is_partitioned()
    }

    pub(crate) fn talos_version(&self) -> String {
        self.talos_version
            .lock()
            .map(|v| v.clone())
            .unwrap_or_default()
    }

    pub(crate) fn set_talos_version(&self, version: &str) {
        if let Ok(mut v) = self.talos_version.lock() {
            version.clone_into(&mut v);
        }
    }

    /// Whether the node runs contract 1.14 or later behaviour (talos-facts §8.2).
    pub(crate) fn is_1_14(&self) -> bool {
        !self.talos_version().starts_with("v1.13.")
    }

    pub(crate) fn fingerprint(&self) -> String {
        self.fingerprint
            .lock()
            .map(|f| f.clone())
            .unwrap_or_default()
    }
}

/// One node on the simulated network.
#[derive(Debug)]
pub(crate) struct Entry {
    pub(crate) shared: Arc<Shared>,
    /// The config it runs, once configured and serving with mutual TLS.
    pub(crate) config: Option<Arc<AppliedConfig>>,
    /// Its hostname.
    pub(crate) hostname: String,
    /// Its API, for requests forwarded to it with the `node` metadata key.
    pub(crate) forward: Option<Controlled>,
}

/// One member of a simulated etcd cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Member {
    pub(crate) id: u64,
    pub(crate) hostname: String,
    pub(crate) addr: SocketAddr,
    pub(crate) learner: bool,
}

impl Member {
    pub(crate) fn peer_url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.addr.ip(), 2380))
    }

    pub(crate) fn client_url(&self) -> String {
        format!("https://{}", SocketAddr::new(self.addr.ip(), 2379))
    }
}

/// A simulated etcd cluster: created by a Bootstrap, joined by control planes of the same
/// cluster identity (talos-facts §5).
#[derive(Debug, Clone)]
pub(crate) struct EtcdCluster {
    pub(crate) id: u64,
    /// The cluster identity of the config that bootstrapped it.
    pub(crate) identity: String,
    pub(crate) members: Vec<Member>,
    pub(crate) leader: u64,
    pub(crate) raft_term: u64,
    pub(crate) raft_index: u64,
    /// Whether a CNI runs in the Kubernetes cluster on top (talos-facts §8.3).
    pub(crate) cni_present: bool,
    /// When it was bootstrapped: joiners see it only after discovery catches up.
    pub(crate) created: tokio::time::Instant,
    /// The Kubernetes data it holds (talos-facts §12.3).
    pub(crate) keyspace: Arc<crate::snapshot::keyspace::Keyspace>,
}

impl EtcdCluster {
    /// What a snapshot of it is taken of.
    pub(crate) fn snapshot_view(&self) -> crate::snapshot::ClusterView {
        crate::snapshot::ClusterView {
            keyspace: Arc::clone(&self.keyspace),
            members: self
                .members
                .iter()
                .map(|m| crate::snapshot::MemberView {
                    id: m.id,
                    name: m.hostname.clone(),
                    peer_urls: vec![m.peer_url()],
                    client_urls: vec![m.client_url()],
                    learner: m.learner,
                })
                .collect(),
            raft_index: self.raft_index,
            raft_term: self.raft_term,
        }
    }
}

/// The network state.
#[derive(Debug, Default)]
pub(crate) struct Inner {
    pub(crate) nodes: BTreeMap<SocketAddr, Entry>,
    pub(crate) clusters: Vec<EtcdCluster>,
}

static NETWORK: LazyLock<StdMutex<Inner>> = LazyLock::new(|| StdMutex::new(Inner::default()));

/// The simulated network every node of this process shares.
pub(crate) fn network() -> MutexGuard<'static, Inner> {
    NETWORK
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

/// Why an etcd call cannot be served.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum EtcdDown {
    /// The node has no etcd member running.
    NotRunning,
    /// The node's member was removed from its cluster.
    Removed,
    /// The cluster lost quorum.
    NoQuorum,
    /// The node's member runs but does not answer (the `EtcdUnhealthy` fault): a client of it
    /// waits until its deadline.
    Unhealthy,
}

impl Inner {
    /// Whether `member` answers: its node is reachable and runs that cluster's etcd, and its
    /// member is not unhealthy.
    pub(crate) fn alive(&self, cluster: u64, member: &Member) -> bool {
        self.nodes.get(&member.addr).is_some_and(|e| {
            e.shared.reachable()
                && e.shared.etcd_running.load(Ordering::SeqCst) == cluster
                && !e.shared.etcd_unhealthy.load(Ordering::SeqCst)
        })
    }

    pub(crate) fn cluster(&self, id: u64) -> Option<&EtcdCluster> {
        self.clusters.iter().find(|c| c.id == id)
    }

    pub(crate) fn cluster_mut(&mut self, id: u64) -> Option<&mut EtcdCluster> {
        self.clusters.iter_mut().find(|c| c.id == id)
    }

    /// Whether a majority of the cluster's voters answers (learners do not vote).
    pub(crate) fn has_quorum(&self, cluster: &EtcdCluster) -> bool {
        let voters: Vec<&Member> = cluster.members.iter().filter(|m| !m.learner).collect();
        let alive = voters.iter().filter(|m| self.alive(cluster.id, m)).count();
        !voters.is_empty() && alive * 2 > voters.len()
    }

    /// Re-elects a leader when the current one does not answer (the lowest live voter wins),
    /// or clears it without quorum. Returns the leader.
    pub(crate) fn settle_leader(&mut self, id: u64) -> u64 {
        let Some(cluster) = self.cluster(id) else {
            return 0;
        };
        let quorum = self.has_quorum(cluster);
        let current = cluster
            .members
            .iter()
            .find(|m| m.id == cluster.leader && !m.learner)
            .filter(|m| self.alive(id, m))
            .map(|m| m.id);
        let elected = if !quorum {
            0
        } else if let Some(leader) = current {
            leader
        } else {
            cluster
                .members
                .iter()
                .filter(|m| !m.learner && self.alive(id, m))
                .map(|m| m.id)
                .min()
                .unwrap_or(0)
        };
        if let Some(cluster) = self.cluster_mut(id)
            && cluster.leader != elected
        {
            cluster.leader = elected;
            if elected != 0 {
                cluster.raft_term += 1;
            }
        }
        elected
    }

    /// The cluster `member` of `cluster` serves, if it is still a member and has quorum.
    pub(crate) fn serving_cluster(
        &mut self,
        cluster: u64,
        member: u64,
    ) -> Result<&mut EtcdCluster, EtcdDown> {
        let Some(c) = self.cluster(cluster) else {
            return Err(EtcdDown::NotRunning);
        };
        if !c.members.iter().any(|m| m.id == member) {
            return Err(EtcdDown::Removed);
        }
        if !self.has_quorum(c) {
            return Err(EtcdDown::NoQuorum);
        }
        self.settle_leader(cluster);
        let c = self.cluster_mut(cluster).ok_or(EtcdDown::NotRunning)?;
        c.raft_index += 1;
        Ok(c)
    }

    /// A cluster a control plane of `identity` finds to join: bootstrapped, with quorum, and
    /// discovered (created at least `discovery` ago). The oldest wins.
    pub(crate) fn joinable(&self, identity: &str, discovery: Duration) -> Option<u64> {
        self.clusters
            .iter()
            .filter(|c| c.identity == identity && c.created.elapsed() >= discovery)
            .filter(|c| self.has_quorum(c))
            .min_by_key(|c| c.created)
            .map(|c| c.id)
    }

    /// The nodes at `ip`, whatever their port: a range of the address-ordered map, not a scan
    /// of every node (each worker asks for its control plane at every tick; a thousand of them
    /// scanning a thousand nodes held the simulator's shared lock).
    fn at_ip(&self, ip: IpAddr) -> impl Iterator<Item = &Entry> {
        self.nodes
            .range(SocketAddr::new(ip, 0)..=SocketAddr::new(ip, u16::MAX))
            .map(|(_, e)| e)
    }

    /// The reachable, configured control plane at `host` (an IP) of the given identity.
    pub(crate) fn control_plane_at(&self, host: &str, identity: &str) -> Option<&Entry> {
        let ip: IpAddr = host.parse().ok()?;
        self.at_ip(ip).find(|e| {
            e.shared.reachable()
                && e.config
                    .as_ref()
                    .is_some_and(|c| c.is_control_plane() && c.cluster_identity() == identity)
        })
    }

    /// The node answering at `target` (an IP, or a hostname), for forwarding.
    pub(crate) fn by_target(&self, target: &str) -> Option<&Entry> {
        match target.parse::<IpAddr>() {
            Ok(ip) => self
                .at_ip(ip)
                .find(|e| e.shared.serving.load(Ordering::SeqCst)),
            Err(_) => self.nodes.values().find(|e| e.hostname == target),
        }
    }
}

/// A fresh random id (member ids, cluster ids).
pub(crate) fn random_id() -> u64 {
    loop {
        let id: u64 = rand::random();
        if id != 0 {
            return id;
        }
    }
}
