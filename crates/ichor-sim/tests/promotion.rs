//! The hold on a learner's promotion: a control plane that joined etcd stays a learner while a
//! test holds it (a replacement still catching up), and promotes itself once released
//! (talos-facts §5).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_sim::{Hardware, SimNode};
use ichor_talos::TalosClient;
use ichor_testenv::nets::SIM_PROMOTION;
use ichor_testenv::wait::eventually;

/// How long the simulated nodes get for what a test waits for.
const WAIT: Duration = Duration::from_secs(10);

/// `(hostname, learner)` of every member, by hostname.
async fn members(client: &TalosClient) -> Vec<(String, bool)> {
    let mut members: Vec<(String, bool)> = client
        .etcd_members(false)
        .await
        .map(|m| m.into_iter().map(|m| (m.hostname, m.learner)).collect())
        .unwrap_or_default();
    members.sort();
    members
}

#[tokio::test]
async fn a_held_learner_stays_a_learner_until_released() {
    // Hostnames come from the hardware (`auto: stable`): two nodes, two members.
    let config =
        support::golden("1.14-controlplane-flannel-plain.yaml").replace("/dev/sda", "/dev/vda");
    let addr = |host: u8| SocketAddr::from((SIM_PROMOTION.ip(0, host), 0));
    let first = SimNode::start_configured(addr(1), "v1.14.1", Hardware::vm(9401), &config)
        .await
        .expect("start");
    let second = SimNode::start_configured(addr(2), "v1.14.1", Hardware::vm(9402), &config)
        .await
        .expect("start");
    let hold = second.hold_promotion();
    let client = support::admin("bundle-1.14.yaml", &first).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    let (one, two) = (first.hostname().await, second.hostname().await);
    tokio::time::timeout(WAIT, hold.arrived(1))
        .await
        .expect("the learner reached its promotion");
    let mut held = vec![(one, false), (two, true)];
    held.sort();
    assert_eq!(members(&client).await, held, "joined, held a learner");
    assert_eq!(
        first.etcd_quorum_view().await,
        Some((1, 1)),
        "a learner does not vote"
    );
    hold.release();
    eventually("the learner promoted", WAIT, || async {
        members(&client).await.iter().all(|(_, learner)| !learner)
    })
    .await;
    assert_eq!(first.etcd_quorum_view().await, Some((2, 2)));
    first.stop().await;
    second.stop().await;
}
