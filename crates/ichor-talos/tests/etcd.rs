//! Bootstrap and etcd membership against simulated control planes whose cluster comes only
//! from their applied configs (talos-facts §1.2, §5): the not-ready window, joins as learners
//! and promotion, leave, remove by id, quorum loss, an unhealthy member on a node that still
//! answers, and the second cluster a second Bootstrap creates.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_sim::{Fault, Hardware, SimNode, Timings};
use ichor_talos::{Bootstrapped, ResetOptions, TalosClient};
use ichor_testenv::nets::TALOS_ETCD;
use ichor_testenv::wait::eventually;
use support::{NodeConfig, WAIT, admin, bundle_for, node_config};

fn addr(net: u8, host: u8) -> SocketAddr {
    SocketAddr::from(([127, 0, net, host], 50000))
}

/// `n` configured control planes on 127.0.`net`.1..n, the first one the endpoint.
async fn control_planes(net: u8, n: u8) -> Vec<(SimNode, TalosClient)> {
    let b = bundle_for(net);
    let endpoint = addr(net, 1).ip().to_string();
    let mut out = Vec::new();
    for host in 1..=n {
        let hostname = format!("cp-{host}");
        let config = node_config(
            &b,
            &NodeConfig {
                role: Role::ControlPlane,
                talos_version: "v1.14.1",
                endpoint_host: &endpoint,
                hostname: Some(&hostname),
                cni: "flannel",
                install: true,
            },
        );
        let node = SimNode::start_configured(
            addr(net, host),
            "v1.14.1",
            Hardware::vm(u32::from(net) * 256 + u32::from(host)),
            &config,
        )
        .await
        .expect("start");
        let client = admin(&b, node.addr()).await;
        out.push((node, client));
    }
    out
}

async fn voters(client: &TalosClient) -> Vec<String> {
    let mut names: Vec<String> = client
        .etcd_members(false)
        .await
        .map(|m| {
            m.into_iter()
                .filter(|m| !m.learner)
                .map(|m| m.hostname)
                .collect()
        })
        .unwrap_or_default();
    names.sort();
    names
}

async fn stop_all(nodes: Vec<(SimNode, TalosClient)>) {
    for (node, _) in nodes {
        node.stop().await;
    }
}

#[tokio::test]
async fn bootstrap_retries_while_the_node_boots_then_reports_already_done() {
    let nodes = control_planes(TALOS_ETCD.net(0), 1).await;
    let client = &nodes[0].1;
    let early = client.machine_status().await.expect("status while booting");
    assert!(!early.ready, "nothing is ready before bootstrap");
    assert_eq!(
        client.bootstrap(Duration::ZERO).await.map_err(|e| e.code()),
        Err(Some(tonic::Code::FailedPrecondition)),
        "without patience the not-ready window is an error"
    );
    assert_eq!(
        client
            .bootstrap(Duration::from_secs(5))
            .await
            .expect("bootstrap"),
        Bootstrapped::Now
    );
    assert_eq!(
        client
            .bootstrap(Duration::from_secs(5))
            .await
            .expect("again"),
        Bootstrapped::Already,
        "a second Bootstrap on the same node is AlreadyExists, which counts as done"
    );
    assert_eq!(voters(client).await, vec!["cp-1"]);
    let status = client.etcd_status().await.expect("status");
    assert_eq!(status.leader, status.member_id, "a lone member leads");
    stop_all(nodes).await;
}

/// `n` control planes of one etcd: the first bootstrapped, every one a voter.
async fn one_etcd(net: u8, n: u8) -> Vec<(SimNode, TalosClient)> {
    let nodes = control_planes(net, n).await;
    nodes[0]
        .1
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    eventually("every control plane a voter", WAIT, || async {
        voters(&nodes[0].1).await.len() == usize::from(n)
    })
    .await;
    nodes
}

#[tokio::test]
async fn three_control_planes_form_one_etcd_and_one_leaves() {
    let nodes = control_planes(TALOS_ETCD.net(1), 3).await;
    nodes[0]
        .1
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    eventually("three voters", WAIT, || async {
        voters(&nodes[0].1).await == ["cp-1", "cp-2", "cp-3"]
    })
    .await;
    assert_eq!(
        voters(&nodes[2].1).await,
        ["cp-1", "cp-2", "cp-3"],
        "every member sees the same cluster"
    );
    let leader = nodes[1].1.etcd_status().await.expect("status").leader;
    assert_ne!(leader, 0);
    for (_, client) in &nodes {
        assert_eq!(client.etcd_status().await.expect("status").leader, leader);
    }

    nodes[2].1.etcd_leave().await.expect("leave");
    assert_eq!(voters(&nodes[0].1).await, ["cp-1", "cp-2"]);
    let err = nodes[2].1.etcd_status().await.expect_err("etcd stopped");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    let services = nodes[2].1.services().await.expect("services");
    assert!(
        services.iter().any(|s| s.id == "etcd" && !s.healthy),
        "{services:?}"
    );
    stop_all(nodes).await;
}

#[tokio::test]
async fn a_dead_member_is_removed_by_id_through_a_healthy_peer_and_quorum_loss_fails_calls() {
    let nodes = one_etcd(TALOS_ETCD.net(2), 3).await;
    let dead_id = nodes[2].0.etcd_member_id().await.expect("a member");
    nodes[2].0.crash().await;

    nodes[0]
        .1
        .etcd_remove_member(dead_id)
        .await
        .expect("remove by id");
    assert_eq!(voters(&nodes[1].1).await, ["cp-1", "cp-2"]);
    let err = nodes[0]
        .1
        .etcd_remove_member(dead_id)
        .await
        .expect_err("already gone");
    assert_eq!(err.code(), Some(tonic::Code::NotFound), "{err}");

    // Two voters, one dead: no quorum.
    nodes[1].0.crash().await;
    let err = nodes[0].1.etcd_members(false).await.expect_err("no quorum");
    assert_eq!(err.code(), Some(tonic::Code::Unavailable), "{err}");
    assert_eq!(
        nodes[0].1.etcd_members(true).await.expect("local").len(),
        2,
        "the local member still answers a local query"
    );
    let status = nodes[0].1.etcd_status().await.expect("status");
    assert_eq!(status.leader, 0, "no leader without quorum");
    nodes[1].0.restart().await.expect("restart");
    eventually("quorum back", WAIT, || async {
        nodes[0].1.etcd_members(false).await.is_ok()
    })
    .await;
    stop_all(nodes).await;
}

#[tokio::test]
async fn a_second_bootstrap_elsewhere_creates_a_second_cluster() {
    let nodes = control_planes(TALOS_ETCD.net(3), 2).await;
    // Both bootstrapped before either discovers the other: two separate etcd clusters, as
    // real Talos would make — which is why Ichor bootstraps exactly once. Discovery is held
    // until both Bootstraps answered: otherwise, on a busy machine, the second could arrive
    // after the first cluster became discoverable, and that node would already have joined it.
    let held: Vec<_> = nodes
        .iter()
        .map(|(node, _)| node.hold_discovery())
        .collect();
    let (a, b) = tokio::join!(
        nodes[0].1.bootstrap(Duration::from_secs(5)),
        nodes[1].1.bootstrap(Duration::from_secs(5))
    );
    assert_eq!(a.expect("first"), Bootstrapped::Now);
    assert_eq!(b.expect("second"), Bootstrapped::Now);
    held.into_iter().for_each(ichor_sim::Gate::release);
    // Each etcd service looks again for long enough that discovery would have shown it the
    // other cluster (every round waits a tick first), and then once more: a merge would have
    // happened by now.
    let timings = Timings::default();
    let discovery_rounds = timings
        .discovery
        .as_nanos()
        .div_ceil(timings.tick.as_nanos());
    let rounds = usize::try_from(discovery_rounds).expect("a round count") + 2;
    let since: Vec<usize> = nodes.iter().map(|(node, _)| node.etcd_rounds()).collect();
    eventually("both etcd services looked again", WAIT, || async {
        nodes
            .iter()
            .zip(&since)
            .all(|((node, _), since)| node.etcd_rounds() >= since + rounds)
    })
    .await;
    assert_eq!(voters(&nodes[0].1).await, ["cp-1"]);
    assert_eq!(voters(&nodes[1].1).await, ["cp-2"]);
    stop_all(nodes).await;
}

#[tokio::test]
async fn forfeit_snapshot_defragment_and_a_failing_leave() {
    let nodes = one_etcd(TALOS_ETCD.net(4), 2).await;
    let first = nodes[0].1.etcd_status().await.expect("status");
    assert_eq!(
        first.leader, first.member_id,
        "the bootstrapped member leads"
    );
    let now = nodes[0].1.etcd_forfeit_leadership().await.expect("forfeit");
    assert_eq!(now, "cp-2", "leadership moved to the other voter");
    assert_ne!(
        nodes[0].1.etcd_status().await.expect("status").leader,
        first.member_id
    );

    let snapshot = nodes[0].1.etcd_snapshot().await.expect("snapshot");
    assert!(!snapshot.is_empty());
    nodes[0].1.etcd_defragment().await.expect("defragment");

    nodes[1]
        .0
        .inject(Fault::FailEtcdLeave(true))
        .await
        .expect("fault");
    nodes[1]
        .1
        .etcd_leave()
        .await
        .expect_err("the injected fault");
    assert_eq!(
        voters(&nodes[0].1).await.len(),
        2,
        "a failed leave changes nothing"
    );
    stop_all(nodes).await;
}

/// The node's boot id, or nothing while it does not answer.
async fn boot_id(client: &TalosClient) -> Option<String> {
    client.boot_id().await.ok()
}

#[tokio::test]
async fn an_unhealthy_member_stays_a_voter_cannot_leave_and_is_removed_through_a_peer() {
    let nodes = one_etcd(TALOS_ETCD.net(5), 3).await;
    let (sick, client) = &nodes[2];
    let id = sick.etcd_member_id().await.expect("a member");
    sick.inject(Fault::EtcdUnhealthy(true))
        .await
        .expect("fault");

    // The node answers; its etcd member does not, and its etcd service is not healthy.
    client.version().await.expect("the Talos API answers");
    let err = client
        .etcd_status()
        .await
        .expect_err("the local member does not answer");
    assert_eq!(err.code(), Some(tonic::Code::DeadlineExceeded), "{err}");
    assert!(
        err.to_string().contains("failed to query etcd status"),
        "{err}"
    );
    let services = client.services().await.expect("services");
    assert!(
        services
            .iter()
            .any(|s| s.id == "etcd" && s.state == "Running" && !s.healthy),
        "{services:?}"
    );
    let status = client.machine_status().await.expect("machine status");
    assert!(
        status
            .unmet
            .iter()
            .any(|(name, reason)| name == "services" && reason.contains("etcd")),
        "{status:?}"
    );

    // Its peers still list it, a voter, and count it down: two of three answer.
    assert_eq!(voters(&nodes[0].1).await, ["cp-1", "cp-2", "cp-3"]);
    assert_eq!(nodes[0].0.etcd_quorum_view().await, Some((3, 2)));
    let peer = nodes[0].1.etcd_status().await.expect("a healthy peer");
    assert!(peer.errors.is_empty(), "{peer:?}");
    assert!(peer.leader != 0 && peer.leader != id, "{peer:?}");

    // It cannot leave: neither by EtcdLeaveCluster nor by a graceful reset, which fails in
    // its leave phase, wipes nothing and reboots the node.
    let err = client.etcd_leave().await.expect_err("no local member id");
    assert!(
        err.to_string()
            .contains("failed to get local etcd member ID"),
        "{err}"
    );
    let before = boot_id(client).await.expect("boot id");
    client
        .reset(ResetOptions {
            graceful: true,
            reboot: true,
        })
        .await
        .expect("the reset is accepted; its sequence fails");
    eventually("the node back from the failed reset", WAIT, || async {
        boot_id(client).await.is_some_and(|now| now != before)
    })
    .await;
    assert_eq!(sick.etcd_member_id().await, Some(id), "nothing was wiped");
    assert_eq!(voters(&nodes[0].1).await, ["cp-1", "cp-2", "cp-3"]);
    assert_eq!(sick.calls("EtcdLeaveCluster"), 1);

    // A healthy peer removes it by id.
    nodes[1]
        .1
        .etcd_remove_member(id)
        .await
        .expect("removed through a healthy peer");
    assert_eq!(voters(&nodes[0].1).await, ["cp-1", "cp-2"]);
    assert_eq!(nodes[0].0.etcd_quorum_view().await, Some((2, 2)));
    stop_all(nodes).await;
}
