//! The simulated Talos networks: which `127.0.<net>.0/24` blocks each test file puts its
//! simulated nodes (and fake servers) on.
//!
//! Test files run as separate processes at the same time, and a simulated node listens on a
//! fixed port (50000) of its address, so two files on one block would take each other's
//! ports. Every file takes its blocks from here, and a unit test checks that no two entries
//! overlap and that none is a block a person runs by hand (the README's demo, the harness
//! binary). Inside one file, the tests keep to their own blocks or hosts. A new entry goes
//! into [`ALL`] too.
//!
//! Not here: tests whose nodes listen on port 0 of 127.0.0.1, tests that only print an
//! address (kubectl-ichor's table and describe fixtures bind nothing), and the workload
//! control plane tests' random `127.31.x.y` endpoints.

use std::net::Ipv4Addr;
use std::ops::RangeInclusive;

/// A run of consecutive `127.0.<net>.0/24` blocks that belongs to one test file or spec set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Nets {
    first: u8,
    count: u8,
}

impl Nets {
    /// `count` blocks from `127.0.<first>.0/24` on.
    const fn new(first: u8, count: u8) -> Self {
        assert!(count > 0 && first as u16 + count as u16 <= 256);
        Self { first, count }
    }

    /// The third octet of block `i` (0 is the first); a constant out of range fails to compile.
    pub const fn net(self, i: u8) -> u8 {
        assert!(
            i < self.count,
            "a test file uses more nets than it registered"
        );
        self.first + i
    }

    /// Host `host` of block `i`: `127.0.<net(i)>.<host>`.
    pub const fn ip(self, i: u8, host: u8) -> Ipv4Addr {
        Ipv4Addr::new(127, 0, self.net(i), host)
    }

    /// Every block's third octet.
    pub const fn range(self) -> RangeInclusive<u8> {
        self.first..=self.first + (self.count - 1)
    }

    /// Whether `net` is one of these blocks.
    pub const fn contains(self, net: u8) -> bool {
        net >= self.first && net - self.first < self.count
    }
}

/// Reserved: the README's demo (`cargo xtask demo`, `ichor-demo --net 10`) and its
/// `ichor-sim --base 127.0.10.1`, run by hand beside the tests.
pub const DEMO: Nets = Nets::new(10, 1);
/// Reserved: `ichor-harness --target sim` (its `--net` default).
pub const HARNESS_BINARY: Nets = Nets::new(90, 1);

/// `ichor-talos/tests/talos_client.rs`: one node per test.
pub const TALOS_CLIENT: Nets = Nets::new(20, 1);
/// `ichor-talos/tests/etcd.rs`: a block per test.
pub const TALOS_ETCD: Nets = Nets::new(30, 6);
/// `ichor-talos/tests/operations.rs`: a block per test.
pub const TALOS_OPERATIONS: Nets = Nets::new(40, 6);
/// `ichor-sim/tests/binary.rs`: the `ichor-sim` binary's `--base`, a block per test.
pub const SIM_BINARY: Nets = Nets::new(50, 2);
/// `ichor-manager/tests/lifecycle.rs`: a block per Talos version.
pub const MANAGER_LIFECYCLE: Nets = Nets::new(60, 2);
/// `ichor-manager/tests/checks.rs`: a block per cluster.
pub const MANAGER_CHECKS: Nets = Nets::new(62, 3);
/// `ichor-talos/tests/install_failures.rs`.
pub const TALOS_INSTALL_FAILURES: Nets = Nets::new(65, 1);
/// `ichor-manager/tests/lifecycle.rs`: the operation reconciled from a stale copy.
pub const MANAGER_OPERATION: Nets = Nets::new(66, 1);
/// `ichor-harness/tests/e2e.rs`: a block per spec.
pub const E2E: Nets = Nets::new(70, 7);
/// `ichor-harness/tests/day2/`: a block per spec.
pub const DAY2: Nets = Nets::new(77, 13);
/// `ichor-harness/tests/day2/versions.rs`: a block per spec.
pub const DAY2_VERSIONS: Nets = Nets::new(221, 4);
/// `ichor-harness/tests/day2/unguarded.rs`.
pub const DAY2_UNGUARDED: Nets = Nets::new(245, 1);
/// `ichor-harness/tests/day2/kubelet.rs`.
pub const DAY2_KUBELET: Nets = Nets::new(246, 1);
/// `ichor-harness/tests/day2/kubernetes.rs`.
pub const DAY2_KUBERNETES: Nets = Nets::new(247, 1);
/// `ichor-harness/tests/credentials.rs`.
pub const CREDENTIALS: Nets = Nets::new(91, 1);
/// `ichor-talos/tests/events.rs`.
pub const TALOS_EVENTS: Nets = Nets::new(92, 1);
/// `ichor-sim/tests/apply_install.rs`.
pub const SIM_APPLY_INSTALL: Nets = Nets::new(93, 1);
/// `ichor-talos/tests/etcd_snapshot.rs`.
pub const TALOS_ETCD_SNAPSHOT: Nets = Nets::new(94, 1);
/// `ichor-sim/tests/talosctl.rs`: its nodes, then the version matrix's.
pub const SIM_TALOSCTL: Nets = Nets::new(97, 1);
/// `ichor-harness/tests/install.rs`: a block per spec.
pub const INSTALL: Nets = Nets::new(98, 2);
/// `ichor-harness/tests/classes.rs`.
pub const CLASSES: Nets = Nets::new(100, 1);
/// `ichor-harness/tests/backups.rs`.
pub const BACKUPS: Nets = Nets::new(101, 1);
/// `ichor-harness/tests/rollout_gates.rs`.
pub const ROLLOUT_GATES: Nets = Nets::new(106, 4);
/// `ichor-harness/tests/backup_at_size.rs`.
pub const BACKUP_AT_SIZE: Nets = Nets::new(102, 1);
/// `ichor-harness/tests/restore.rs`: the original cluster's block, then the restored one's.
pub const RESTORE: Nets = Nets::new(103, 2);
/// `ichor-harness/tests/adoption.rs`.
pub const ADOPTION: Nets = Nets::new(105, 1);
/// `ichor-talos/benches/discovery.rs`: four /24s to sweep.
pub const DISCOVERY_BENCH: Nets = Nets::new(110, 4);
/// `ichor-harness/tests/fleet.rs`: eight /24s of /27 clusters.
pub const FLEET: Nets = Nets::new(120, 8);
/// `ichor-harness/tests/chaos.rs`: a block per spec.
pub const CHAOS: Nets = Nets::new(131, 4);
/// `kubectl-ichor/tests/sim.rs`: a block per test.
pub const KUBECTL_SIM: Nets = Nets::new(135, 2);
/// `kubectl-ichor/tests/plan.rs`: `kubectl ichor plan` against what the manager then does, a
/// block per test.
pub const KUBECTL_PLAN: Nets = Nets::new(137, 2);
/// `ichor-talos/tests/limits.rs`.
pub const TALOS_LIMITS: Nets = Nets::new(150, 1);
/// `ichor-sim/tests/apply_verdicts.rs`: single nodes, then the version sweep.
pub const SIM_APPLY_VERDICTS: Nets = Nets::new(170, 2);
/// `ichor-talos/tests/user_volumes.rs`.
pub const TALOS_USER_VOLUMES: Nets = Nets::new(172, 1);
/// `ichor-sim/tests/talosctl.rs`: the version matrix.
pub const SIM_TALOSCTL_VERSIONS: Nets = Nets::new(173, 1);
/// `ichor-talos/tests/cosi.rs`: one node per Talos version.
pub const TALOS_COSI: Nets = Nets::new(174, 1);
/// `ichor-sim/tests/promotion.rs`.
pub const SIM_PROMOTION: Nets = Nets::new(175, 1);
/// `ichor-sim/tests/factory.rs`.
pub const SIM_FACTORY: Nets = Nets::new(176, 1);
/// `ichor-talos/tests/discovery.rs`: four swept /24s, then the wrong-network one.
pub const TALOS_DISCOVERY: Nets = Nets::new(180, 5);
/// `ichor-harness/tests/panics.rs`.
pub const PANICS: Nets = Nets::new(201, 1);
/// `ichor-harness/tests/classes.rs`: the claims spec (two namespaces, one machine).
pub const CLAIMS: Nets = Nets::new(211, 1);

/// `ichor-harness/tests/day2/`: the specs of ADR 0052 (a teardown admission never saw, a
/// replacement at a tombstoned address), a block per spec.
pub const TRUST: Nets = Nets::new(215, 2);
/// `ichor-harness/tests/rails.rs`: the `ichor-harness up` that is stopped with SIGTERM.
pub const RAILS: Nets = Nets::new(217, 1);
/// `ichor-manager/tests/lifecycle.rs`: a bootstrap while the talosconfig cannot be written.
pub const MANAGER_INDEPENDENT: Nets = Nets::new(218, 1);

/// Every entry, by name.
pub const ALL: &[(&str, Nets)] = &[
    ("DEMO", DEMO),
    ("HARNESS_BINARY", HARNESS_BINARY),
    ("TALOS_CLIENT", TALOS_CLIENT),
    ("TALOS_ETCD", TALOS_ETCD),
    ("TALOS_OPERATIONS", TALOS_OPERATIONS),
    ("SIM_BINARY", SIM_BINARY),
    ("MANAGER_LIFECYCLE", MANAGER_LIFECYCLE),
    ("MANAGER_CHECKS", MANAGER_CHECKS),
    ("TALOS_INSTALL_FAILURES", TALOS_INSTALL_FAILURES),
    ("MANAGER_OPERATION", MANAGER_OPERATION),
    ("E2E", E2E),
    ("DAY2", DAY2),
    ("DAY2_VERSIONS", DAY2_VERSIONS),
    ("DAY2_UNGUARDED", DAY2_UNGUARDED),
    ("DAY2_KUBELET", DAY2_KUBELET),
    ("DAY2_KUBERNETES", DAY2_KUBERNETES),
    ("CREDENTIALS", CREDENTIALS),
    ("TALOS_EVENTS", TALOS_EVENTS),
    ("SIM_APPLY_INSTALL", SIM_APPLY_INSTALL),
    ("TALOS_ETCD_SNAPSHOT", TALOS_ETCD_SNAPSHOT),
    ("SIM_TALOSCTL", SIM_TALOSCTL),
    ("INSTALL", INSTALL),
    ("CLASSES", CLASSES),
    ("BACKUPS", BACKUPS),
    ("BACKUP_AT_SIZE", BACKUP_AT_SIZE),
    ("ROLLOUT_GATES", ROLLOUT_GATES),
    ("RESTORE", RESTORE),
    ("ADOPTION", ADOPTION),
    ("DISCOVERY_BENCH", DISCOVERY_BENCH),
    ("FLEET", FLEET),
    ("CHAOS", CHAOS),
    ("KUBECTL_SIM", KUBECTL_SIM),
    ("KUBECTL_PLAN", KUBECTL_PLAN),
    ("TALOS_LIMITS", TALOS_LIMITS),
    ("SIM_APPLY_VERDICTS", SIM_APPLY_VERDICTS),
    ("TALOS_USER_VOLUMES", TALOS_USER_VOLUMES),
    ("SIM_TALOSCTL_VERSIONS", SIM_TALOSCTL_VERSIONS),
    ("TALOS_COSI", TALOS_COSI),
    ("SIM_PROMOTION", SIM_PROMOTION),
    ("SIM_FACTORY", SIM_FACTORY),
    ("TALOS_DISCOVERY", TALOS_DISCOVERY),
    ("PANICS", PANICS),
    ("CLAIMS", CLAIMS),
    ("TRUST", TRUST),
    ("RAILS", RAILS),
    ("MANAGER_INDEPENDENT", MANAGER_INDEPENDENT),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_two_entries_share_a_net() {
        let mut owner = [None::<&str>; 256];
        for (name, nets) in ALL {
            for net in nets.range() {
                if let Some(other) = owner[usize::from(net)] {
                    panic!("127.0.{net}.0/24 is both {other}'s and {name}'s");
                }
                owner[usize::from(net)] = Some(name);
            }
        }
    }

    #[test]
    fn no_entry_is_the_loopback_block_or_a_net_run_by_hand() {
        for (name, nets) in ALL {
            assert!(!nets.contains(0), "{name} holds 127.0.0.0/24");
            if !matches!(*name, "DEMO" | "HARNESS_BINARY") {
                for reserved in [DEMO, HARNESS_BINARY] {
                    for net in reserved.range() {
                        assert!(
                            !nets.contains(net),
                            "{name} holds reserved 127.0.{net}.0/24"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn a_block_names_its_hosts() {
        assert_eq!(DAY2.net(0), 77);
        assert_eq!(DAY2.ip(2, 5), Ipv4Addr::new(127, 0, 79, 5));
        assert_eq!(FLEET.range(), 120..=127);
        assert!(FLEET.contains(127) && !FLEET.contains(128));
    }
}
