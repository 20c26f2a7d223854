//! Chaos where the kill points do not reach, on the sim target (its control plane is its own):
//! two manager replicas, the leader SIGKILLed mid-removal and mid-operation, the other taking
//! over within the Lease. In every case the work resumes, no once-only step runs twice
//! (counted on the simulated nodes), and etcd keeps quorum (a monitor watches it every few
//! milliseconds).
//!
//! The kill points (tests/day2.rs, tests/e2e.rs) restart the one manager; the fail-closed specs
//! stop the workload apiserver and partition a node from everyone. These are the faults that
//! neither reaches.

use std::time::{Duration, Instant};

use ichor_api::TalosOperation;
use ichor_api::operation::{OperationAction, OperationPhase};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Gate, Stage};
use ichor_testenv::wait::try_eventually;

mod support;

use support::cluster::{CLUSTER, Monitor, cluster_of, etcd_members, gone, uid_of};

/// Kills the replica holding the manager's Lease and waits until another takes it; checks
/// that the other took it only once the killed one's lease ran out, and within the Lease
/// duration plus one retry period of the kill. Returns the new holder.
async fn kill_leader_and_wait_takeover(target: &mut SimTarget) -> String {
    let lease = Duration::from_secs(target.options().lease_seconds);
    // The manager retries (and renews) every fifth of the Lease's duration.
    let retry = lease / 5;
    let killed = target.kill_leader().await.expect("kill the leader");
    let killed_at = Instant::now();
    let target: &SimTarget = target;
    let last = target
        .manager_lease()
        .await
        .expect("the Lease")
        .expect("a Lease");
    let last_renewal = last.renew_time.expect("renewed").0;
    let (holder, taken) =
        try_eventually("another replica to take the Lease", lease * 4, || async {
            match target.manager_lease().await {
                Ok(Some(spec)) if spec.holder_identity.as_deref() != Some(killed.as_str()) => {
                    Ok((spec, killed_at.elapsed()))
                }
                other => Err(format!("{other:?}")),
            }
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", target.manager_log_tail()));
    let new = holder.holder_identity.clone().expect("a holder");
    assert!(
        target.manager_identities().contains(&new),
        "{new} is a running replica"
    );
    // Safety: never before the killed leader's lease ran out (both times are the replicas' own
    // clocks, on this machine).
    let acquired = holder.acquire_time.expect("acquired").0;
    let gap = Duration::try_from(acquired.duration_since(last_renewal)).unwrap_or_default();
    assert!(
        gap >= lease,
        "{new} took the Lease {gap:?} after the last renewal, before the {lease:?} ran out"
    );
    // Liveness, the bound the design promises: the Lease's duration plus one retry period from
    // the kill. The margin is for this machine's scheduling and the test's own polling.
    let bound = lease + retry + Duration::from_secs(3);
    assert!(
        taken <= bound,
        "{new} took over {taken:?} after the kill; the bound is {lease:?} + {retry:?} (+3 s)"
    );
    eprintln!(
        "failover: {killed} killed, {new} leads {taken:?} later ({gap:?} after the last renewal)"
    );
    new
}

/// Holds the reply of `method` on every node: whichever node gets the call first acts, and the
/// manager does not hear of it.
fn hold_replies(target: &SimTarget, method: &str) -> Vec<Gate> {
    target
        .nodes()
        .iter()
        .map(|node| node.gate_reply(method))
        .collect()
}

/// Starts again whichever replica is not running, so that two run.
async fn restore_second_replica(target: &mut SimTarget) {
    if target.manager_pid().is_none() {
        target
            .start_manager()
            .await
            .expect("restart the first replica");
    } else {
        target
            .start_second_manager()
            .await
            .expect("restart the second replica");
    }
    assert_eq!(target.manager_identities().len(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_standby_replica_takes_over_a_killed_leader_mid_removal_and_mid_operation() {
    let mut target = SimTarget::up(SimOptions::new(4, 131, "v1.14.1"))
        .await
        .expect("sim target");
    target
        .start_second_manager()
        .await
        .expect("a second replica");
    cluster_of(&target, 3, 4, 0).await;
    let endpoints = target.node_endpoints();
    let monitor = Monitor::start(target.nodes().to_vec());

    // Mid-removal: the node left etcd, the leader never heard, and is killed.
    let node = target.nodes()[3].clone();
    let leave = node.gate_reply("EtcdLeaveCluster");
    let name = specs::delete_machine(&target, &endpoints[3])
        .await
        .expect("the webhook admits 4 -> 3");
    let uid = uid_of(&target, &name).await;
    tokio::time::timeout(Duration::from_secs(90), leave.arrived(1))
        .await
        .expect("the etcd leave was sent");
    kill_leader_and_wait_takeover(&mut target).await;
    leave.release();
    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    try_eventually(
        "the node in maintenance",
        Duration::from_secs(30),
        || async { node.stage().await == Stage::Maintenance },
    )
    .await
    .expect("reset into maintenance");
    assert_eq!(node.calls("EtcdLeaveCluster"), 1, "the leave ran once");
    assert_eq!(node.calls("Reset"), 1, "the reset ran once");
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 3, "{members:?}");

    // Mid-operation: an upgrade of every control plane; the first node installs the new
    // version, the leader never hears, and is killed. The other replica (the killed one back as
    // a standby) resumes.
    restore_second_replica(&mut target).await;
    let nodes = target.nodes()[..3].to_vec();
    let before: Vec<(usize, usize)> = nodes
        .iter()
        .map(|n| (n.calls("Upgrade"), n.calls("Reboot")))
        .collect();
    let replies = hold_replies(&target, "Upgrade");
    specs::create_operation(
        &target,
        TalosOperation::test("upgrade-all", OperationAction::Upgrade)
            .cluster(CLUSTER)
            .all()
            .image("ghcr.io/siderolabs/installer:v1.14.2"),
    )
    .await
    .expect("operation");
    try_eventually(
        "the first upgrade sent",
        Duration::from_secs(90),
        || async { replies.iter().any(|gate| gate.count() > 0) },
    )
    .await
    .expect("an upgrade was sent");
    let unheard: Vec<bool> = replies.iter().map(|gate| gate.count() > 0).collect();
    kill_leader_and_wait_takeover(&mut target).await;
    drop(replies);
    let done = specs::wait_operation(&target, "upgrade-all", Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", target.manager_log_tail()));
    let status = done.status.expect("status");
    assert_eq!(status.phase, OperationPhase::Succeeded, "{status:?}");
    assert_eq!(status.nodes.len(), 3, "{status:?}");
    for ((node, (upgrades, reboots)), unheard) in nodes.iter().zip(&before).zip(&unheard) {
        let addr = node.addr();
        assert_eq!(node.talos_version(), "v1.14.2", "{addr} upgraded");
        assert_eq!(
            node.calls("Reboot") - reboots,
            1,
            "{addr} rebooted into the new version once"
        );
        // An install whose answer was lost is sent again before the one reboot: the node
        // keeps no record the manager can read of an installed version not yet booted
        // (docs/adr/0033). Every other install runs once.
        let installs = node.calls("Upgrade") - upgrades;
        if *unheard {
            assert!((1..=2).contains(&installs), "{addr}: {installs} installs");
        } else {
            assert_eq!(installs, 1, "{addr} installed once");
        }
    }
    let seen = monitor.finish().await;
    let (alive, voters) = seen.worst.expect("the monitor saw etcd");
    assert!(alive * 2 > voters, "quorum held: worst {alive}/{voters}");
    target.down().await;
}
