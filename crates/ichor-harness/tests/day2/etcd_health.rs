//! etcd health as removals and operations see it: a replacement counts once it is a voter (a
//! learner does not), an unhealthy voter holds every disruption of the healthy control planes
//! (at the door and in the controller), and an unhealthy member on a node that still answers is
//! force-removed through a healthy peer.

use std::time::Duration;

use ichor_api::TalosOperation;
use ichor_api::names::{conditions, reasons};
use ichor_api::operation::OperationAction;
use ichor_api::operation::OperationPhase;
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::Fault;
use ichor_testenv::nets::DAY2;
use ichor_testenv::wait::try_eventually;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::support::cluster::{
    CLUSTER, Monitor, etcd_members, force_removed, gone, ready_target, state_summary, uid_of,
};
use crate::{operation_at, refused, removal_reason};

/// Waits until the manager has recorded the etcd member of the machine at `address` as
/// `holds` says; returns the machine's status.
async fn observed(
    target: &SimTarget,
    address: &str,
    what: &str,
    holds: impl Fn(&ichor_api::machine::TalosMachineStatus) -> bool,
) -> ichor_api::machine::TalosMachineStatus {
    try_eventually(what, Duration::from_secs(120), || async {
        let status = specs::machine_at(target, address)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        if holds(&status) {
            Ok(status)
        } else {
            Err(format!(
                "etcd {:?}, member {:?}, applied {:?}",
                status.etcd.observed, status.lifecycle.etcd_member_id, status.applied.config_hash
            ))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replacement_counts_once_a_voter_and_an_unhealthy_voter_holds_the_healthy_ones() {
    let target = ready_target(SimOptions::new(4, DAY2.net(7), "v1.14.1"), 3, 3, 0).await;
    let endpoints = target.node_endpoints();
    let monitor = Monitor::start(target.nodes().to_vec());

    // A replacement must be a voter. A fourth control plane is approved; it joins etcd as a
    // learner and is held there, as a new member still catching up is.
    let promotion = target.nodes()[3].hold_promotion();
    specs::approve(&target, &endpoints[3], true, "cp-4")
        .await
        .expect("approve cp-4");
    tokio::time::timeout(Duration::from_secs(120), promotion.arrived(1))
        .await
        .unwrap_or_else(|_| panic!("cp-4 never joined etcd: {}", state_summary(&target)));
    // The manager recorded it so: configured, in etcd, not a voter (the door would count a
    // control plane never observed as an unhealthy voter).
    observed(&target, &endpoints[3], "cp-4 observed as a learner", |s| {
        s.applied.config_hash.is_some()
            && s.lifecycle.etcd_member_id.is_some()
            && s.etcd
                .observed
                .as_ref()
                .is_some_and(|o| !o.voter && !o.healthy)
    })
    .await;
    let cp2 = target.nodes()[1].clone();
    let name = specs::delete_machine(&target, &endpoints[1])
        .await
        .expect("admitted: voters 3 -> 2 keep quorum");
    let uid = uid_of(&target, &name).await;
    try_eventually("AwaitingReplacement", Duration::from_secs(90), || async {
        match removal_reason(&target, &endpoints[1]).await {
            Some(reason) if reason == reasons::AWAITING_REPLACEMENT => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert_eq!(cp2.calls("EtcdLeaveCluster"), 0, "cp-2 still in etcd");
    let members = etcd_members(&target, &endpoints[0]).await;
    assert_eq!(members.len(), 4, "{members:?}");
    assert_eq!(
        members.iter().filter(|m| m.learner).count(),
        1,
        "{members:?}"
    );
    // cp-4 becomes a voter: the removal goes on, leaving three voters.
    promotion.release();
    gone(&target, &name, &uid, Duration::from_secs(120)).await;
    let members = etcd_members(&target, &endpoints[0]).await;
    let mut voters: Vec<String> = members
        .iter()
        .filter(|m| !m.learner)
        .map(|m| m.hostname.clone())
        .collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-3", "cp-4"], "{members:?}");
    assert_eq!(members.len(), 3, "{members:?}");
    assert_eq!(cp2.calls("EtcdLeaveCluster"), 1, "cp-2 left once");

    // An unhealthy voter holds disruption of the healthy ones. cp-3 drops off the network.
    // The reboot of cp-1 is created at once: the door judges on what the manager recorded,
    // which cannot know yet (a node that does not answer takes ~10 s to time out); the
    // controller looks at every voter again before acting, and waits.
    let cp1 = specs::machine_at(&target, &endpoints[0])
        .await
        .expect("cp-1")
        .name_any();
    let cp3 = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("cp-3")
        .name_any();
    let cp4 = specs::machine_at(&target, &endpoints[3])
        .await
        .expect("cp-4")
        .name_any();
    let reboots = target.nodes()[0].calls("Reboot");
    target.nodes()[2]
        .inject(Fault::Partition)
        .await
        .expect("partition");
    specs::create_operation(
        &target,
        TalosOperation::test("reboot-cp-1", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp1),
    )
    .await
    .expect("admitted on the recorded observations");
    let (status, reason, message) = operation_at(
        &target,
        "reboot-cp-1",
        reasons::ETCD_UNHEALTHY,
        Duration::from_secs(90),
    )
    .await;
    assert_eq!(reason, reasons::ETCD_UNHEALTHY, "{status:?}");
    assert!(message.contains(&cp3), "{message}");
    assert_eq!(
        status.run.nodes[0].phase,
        OperationPhase::Waiting,
        "{status:?}"
    );
    assert_eq!(
        target.nodes()[0].calls("Reboot"),
        reboots,
        "cp-1 was not rebooted"
    );
    // Now the manager has recorded cp-3 unhealthy: the door refuses another reboot.
    let message = refused(
        &target,
        TalosOperation::test("reboot-cp-4", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&cp4),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    assert!(message.contains(&cp3), "{message}");

    // The unhealthy member itself may go, through a healthy peer, once the declared count
    // allows it: cp-2's node, back in maintenance mode and discovered again, replaces it.
    try_eventually(
        "cp-2's node discovered again",
        Duration::from_secs(60),
        || async {
            specs::machine_at(&target, &endpoints[1])
                .await
                .ok()
                .filter(|m| m.metadata.uid != uid)
                .map(|m| m.name_any())
        },
    )
    .await
    .expect("discovered again");
    specs::approve(&target, &endpoints[1], true, "cp-5")
        .await
        .expect("approve cp-5");
    observed(&target, &endpoints[1], "cp-5 a healthy voter", |s| {
        s.etcd
            .observed
            .as_ref()
            .is_some_and(|o| o.voter && o.healthy)
    })
    .await;
    force_removed(&target, &cp3, &endpoints[2], Duration::from_secs(180)).await;
    specs::events_once(&target, "ResetSkipped", Duration::from_secs(30))
        .await
        .expect("the skipped reset has an Event");
    // Every voter healthy again: the reboot goes ahead.
    let done = specs::wait_operation(&target, "reboot-cp-1", Duration::from_secs(180))
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)))
        .status
        .expect("status");
    assert_eq!(done.run.phase, OperationPhase::Succeeded, "{done:?}");
    assert_eq!(target.nodes()[0].calls("Reboot"), reboots + 1);
    let members = etcd_members(&target, &endpoints[0]).await;
    let mut voters: Vec<String> = members.iter().map(|m| m.hostname.clone()).collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-4", "cp-5"], "{members:?}");
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
}

/// Deletes the machine at `address` (with the allow-delete annotation), which the webhook must
/// refuse with `reason`; returns the refusal's message.
async fn delete_refused(target: &SimTarget, address: &str, reason: &str) -> String {
    match specs::delete_machine(target, address).await {
        Err(ichor_harness::Error::Kube(kube::Error::Api(status))) => {
            assert_eq!(status.reason, reason, "{address}: {status:?}");
            status.message
        }
        other => panic!("the delete of {address} should be refused with {reason}, got {other:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unhealthy_etcd_member_holds_every_other_control_plane_and_can_be_force_removed_through_a_peer()
 {
    // Five control planes in a cluster declaring five: a delete is admitted and waits for a
    // replacement, so it is under way before any member is unhealthy.
    let target = ready_target(SimOptions::new(5, DAY2.net(10), "v1.14.1"), 5, 5, 0).await;
    let endpoints = target.node_endpoints();
    let mut names = Vec::new();
    for address in &endpoints {
        names.push(
            specs::machine_at(&target, address)
                .await
                .expect("machine")
                .name_any(),
        );
    }
    let monitor = Monitor::start(target.nodes().to_vec());
    let cp2 = specs::delete_machine(&target, &endpoints[1])
        .await
        .expect("admitted: every voter healthy, 5 -> 4 keeps quorum");
    let uid2 = uid_of(&target, &cp2).await;
    try_eventually("AwaitingReplacement", Duration::from_secs(60), || async {
        match removal_reason(&target, &endpoints[1]).await {
            Some(reason) if reason == reasons::AWAITING_REPLACEMENT => Ok(()),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));

    // cp-5's etcd member fails while its node answers. The removal looks at every voter
    // again before it goes on, and now waits for etcd's health, naming cp-5.
    let sick = target.nodes()[4].clone();
    sick.inject(Fault::EtcdUnhealthy(true))
        .await
        .expect("fault");
    let message = try_eventually("EtcdUnhealthy", Duration::from_secs(60), || async {
        match specs::machine_condition(&target, &endpoints[1], conditions::REMOVAL_APPROVED).await {
            Some((_, reason, message)) if reason == reasons::ETCD_UNHEALTHY => Ok(message),
            other => Err(format!("{other:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", state_summary(&target)));
    assert!(message.contains(&names[4]), "{message}");
    observed(&target, &endpoints[4], "cp-5 an unhealthy voter", |s| {
        s.etcd
            .observed
            .as_ref()
            .is_some_and(|o| o.voter && !o.healthy)
    })
    .await;
    assert!(sick.is_serving().await, "its node still answers");

    // At the door, nothing disruptive goes to a healthy control plane.
    let message = refused(
        &target,
        TalosOperation::test("reboot-cp-1", OperationAction::Reboot)
            .cluster(CLUSTER)
            .machine(&names[0]),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    assert!(message.contains(&names[4]), "{message}");
    refused(
        &target,
        TalosOperation::test("reset-cp-4", OperationAction::Reset)
            .cluster(CLUSTER)
            .machine(&names[3])
            .allow_delete(),
        reasons::ETCD_UNHEALTHY,
    )
    .await;
    // (cp-1's address is the cluster's endpoint: its delete is refused for that first.)
    let message = delete_refused(&target, &endpoints[2], reasons::ETCD_UNHEALTHY).await;
    assert!(message.contains(&names[4]), "{message}");
    for (i, node) in target.nodes()[..4].iter().enumerate() {
        for method in ["EtcdLeaveCluster", "Reset", "Reboot", "Upgrade"] {
            assert_eq!(node.calls(method), 0, "cp-{}: {method}", i + 1);
        }
    }
    assert_eq!(etcd_members(&target, &endpoints[0]).await.len(), 5);

    // The unhealthy member goes through a healthy peer: with the force annotation, once the
    // declared count (lowered to three) no longer waits for its replacement.
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"controlPlane": {"count": 3}}})),
        )
        .await
        .expect("three control planes declared");
    force_removed(&target, &names[4], &endpoints[4], Duration::from_secs(120)).await;
    let through_peers: usize = target.nodes()[..4]
        .iter()
        .map(|n| n.calls("EtcdRemoveMemberByID"))
        .sum();
    assert!(through_peers >= 1, "removed by id through a healthy peer");
    assert_eq!(sick.calls("EtcdRemoveMemberByID"), 0);
    let members = etcd_members(&target, &endpoints[0]).await;
    assert!(
        members.iter().all(|m| m.hostname != "cp-5") && members.len() == 4,
        "{members:?}"
    );

    // Every voter healthy again: cp-2's removal goes on, leaving etcd by itself.
    gone(&target, &cp2, &uid2, Duration::from_secs(120)).await;
    assert_eq!(
        target.nodes()[1].calls("EtcdLeaveCluster"),
        1,
        "cp-2 left once"
    );
    let mut voters: Vec<String> = etcd_members(&target, &endpoints[0])
        .await
        .into_iter()
        .map(|m| m.hostname)
        .collect();
    voters.sort();
    assert_eq!(voters, ["cp-1", "cp-3", "cp-4"]);
    for node in [0, 2, 3].map(|i| &target.nodes()[i]) {
        for method in ["EtcdLeaveCluster", "Reset", "Reboot", "Upgrade"] {
            assert_eq!(node.calls(method), 0, "{method}");
        }
    }
    let seen = monitor.finish().await;
    assert!(seen.worst.is_some_and(|(a, v)| a * 2 > v), "{seen:?}");
    target.down().await;
}
