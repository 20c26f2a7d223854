//! A control plane's Kubernetes components as its Talos API reports them (talos-facts §14):
//! the kubelet's status of each control-plane static pod follows the running config's images
//! (the old pod reported until the kubelet has replaced it, the new one then unready for a
//! while), and the bootstrap manifests follow the config at once.

mod support;

use std::time::Duration;

use ichor_sim::{Hardware, NodeSpec, SimNode, Timings};
use ichor_talos::{ApplyMode, ControlPlaneComponent, StaticPodStatus, TalosClient};
use ichor_testenv::wait::eventually;

/// How long the simulated nodes get for what a test waits for.
const WAIT: Duration = Duration::from_secs(10);

/// How long a static pod takes to be replaced, then to become ready: long enough for a test
/// to see each step on a busy machine.
const STATIC_POD: Duration = Duration::from_secs(1);

const API_SERVER_1_36: &str = "registry.k8s.io/kube-apiserver:v1.36.3";
const API_SERVER_1_37: &str = "registry.k8s.io/kube-apiserver:v1.37.0";

/// The status of `component`'s pod, if the node reports one.
async fn pod(client: &TalosClient, component: ControlPlaneComponent) -> Option<StaticPodStatus> {
    client
        .static_pod_statuses()
        .await
        .expect("static pod statuses")
        .into_iter()
        .find(|s| s.component == Some(component))
}

/// A bootstrapped control plane of the 1.14 golden config, and an admin client.
async fn control_plane(config: &str, seed: u32) -> (SimNode, TalosClient) {
    let node = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(seed),
        timings: Timings {
            static_pod: STATIC_POD,
            ..Timings::default()
        },
        config: Some(config.to_owned()),
        ..NodeSpec::new("127.0.0.1:0".parse().expect("address"), "v1.14.1")
    })
    .await
    .expect("a simulated node");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    client
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    (node, client)
}

#[tokio::test]
async fn a_static_pod_follows_an_image_change_applied_to_the_config() {
    let config =
        support::golden("1.14-controlplane-flannel-plain.yaml").replace("/dev/sda", "/dev/vda");
    let (node, client) = control_plane(&config, 9501).await;
    eventually("every control-plane static pod ready", WAIT, || async {
        let statuses = client.static_pod_statuses().await.expect("statuses");
        statuses.len() == 3 && statuses.iter().all(|s| s.ready)
    })
    .await;
    let statuses = client.static_pod_statuses().await.expect("statuses");
    let hostname = node.hostname().await.to_lowercase();
    let ids: Vec<&str> = statuses.iter().map(|s| s.id.as_str()).collect();
    assert_eq!(
        ids,
        [
            format!("kube-system/kube-apiserver-{hostname}"),
            format!("kube-system/kube-controller-manager-{hostname}"),
            format!("kube-system/kube-scheduler-{hostname}"),
        ]
    );
    for status in &statuses {
        let component = status.component.expect("a control-plane component");
        let image = format!("registry.k8s.io/{}:v1.36.3", component.pod_name());
        assert!(status.runs_ready(&image), "{status:?}");
        assert_eq!(status.containers[0].name, component.pod_name());
    }

    let changed = config.replace(API_SERVER_1_36, API_SERVER_1_37);
    assert_ne!(changed, config);
    client
        .apply_configuration(changed.as_bytes(), ApplyMode::Auto)
        .await
        .expect("apply");
    // Until the kubelet has replaced the pod, it reports the old one, ready.
    let old = pod(&client, ControlPlaneComponent::ApiServer)
        .await
        .expect("the API server's pod");
    assert!(old.runs_ready(API_SERVER_1_36), "{old:?}");
    eventually("the new API server pod, not ready yet", WAIT, || async {
        pod(&client, ControlPlaneComponent::ApiServer)
            .await
            .is_some_and(|s| {
                s.containers.iter().all(|c| c.image == API_SERVER_1_37)
                    && !s.ready
                    && s.phase == "Running"
            })
    })
    .await;
    eventually("the new API server pod ready", WAIT, || async {
        pod(&client, ControlPlaneComponent::ApiServer)
            .await
            .is_some_and(|s| s.runs_ready(API_SERVER_1_37))
    })
    .await;
    let scheduler = pod(&client, ControlPlaneComponent::Scheduler)
        .await
        .expect("the scheduler's pod");
    assert!(
        scheduler.runs_ready("registry.k8s.io/kube-scheduler:v1.36.3"),
        "the other pods stay: {scheduler:?}"
    );
    node.stop().await;
}

#[tokio::test]
async fn the_bootstrap_manifests_follow_the_config() {
    let config =
        support::golden("1.14-controlplane-flannel-plain.yaml").replace("/dev/sda", "/dev/vda");
    let (node, client) = control_plane(&config, 9502).await;
    let manifests = client.manifests().await.expect("manifests");
    let ids: Vec<&str> = manifests.iter().map(|m| m.id.as_str()).collect();
    assert_eq!(ids, ["10-kube-proxy", "11-core-dns", "11-core-dns-svc"]);
    let daemon_set = |manifests: &[ichor_talos::Manifest]| {
        manifests[0]
            .objects
            .iter()
            .find(|o| o["kind"] == "DaemonSet")
            .expect("the kube-proxy DaemonSet")
            .clone()
    };
    let container = &daemon_set(&manifests)["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(container["image"], "registry.k8s.io/kube-proxy:v1.36.3");
    assert_eq!(
        container["command"][1], "--config=/var/lib/kube-proxy/config.conf",
        "a KubeProxyConfig document runs kube-proxy with a configuration file"
    );
    let deployment = manifests[1]
        .objects
        .iter()
        .find(|o| o["kind"] == "Deployment")
        .expect("the CoreDNS Deployment");
    assert_eq!(
        deployment["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.k8s.io/coredns/coredns:v1.14.7"
    );
    assert_eq!(manifests[2].objects[0]["spec"]["clusterIP"], "10.96.0.10");

    let changed = config.replace(
        "registry.k8s.io/kube-proxy:v1.36.3",
        "registry.k8s.io/kube-proxy:v1.37.0",
    );
    client
        .apply_configuration(changed.as_bytes(), ApplyMode::Auto)
        .await
        .expect("apply");
    let manifests = client.manifests().await.expect("manifests");
    assert_eq!(
        daemon_set(&manifests)["spec"]["template"]["spec"]["containers"][0]["image"],
        "registry.k8s.io/kube-proxy:v1.37.0"
    );
    node.stop().await;
}

/// Talos renders the static pods only once etcd is healthy: a control plane not bootstrapped
/// yet has its manifests but no static pods.
#[tokio::test]
async fn no_static_pods_before_etcd_runs() {
    let config =
        support::golden("1.14-controlplane-flannel-plain.yaml").replace("/dev/sda", "/dev/vda");
    let node = SimNode::start_configured(
        "127.0.0.1:0".parse().expect("address"),
        "v1.14.1",
        Hardware::vm(9503),
        &config,
    )
    .await
    .expect("a simulated node");
    let client = support::admin("bundle-1.14.yaml", &node).await;
    // The node's background work has looked often enough for a static pod to have been
    // reported (every round waits a tick; a new pod shows after `static_pod`), and then twice
    // more: counted on the etcd service's rounds, which run on the same tick.
    let timings = Timings::default();
    let rounds = usize::try_from(
        timings
            .static_pod
            .as_nanos()
            .div_ceil(timings.tick.as_nanos()),
    )
    .expect("a round count")
        + 2;
    let since = node.etcd_rounds();
    eventually("the node looked again", Duration::from_secs(10), || async {
        node.etcd_rounds() >= since + rounds
    })
    .await;
    assert_eq!(client.static_pod_statuses().await.expect("statuses"), []);
    assert_eq!(client.manifests().await.expect("manifests").len(), 3);
    node.stop().await;
}
