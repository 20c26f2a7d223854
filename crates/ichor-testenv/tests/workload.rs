//! A simulated workload cluster's control plane behaves as the real one would for Ichor: it
//! serves on the cluster endpoint with the cluster's Kubernetes CA and trusts that CA's client
//! certificates; nodes a "kubelet" registers become Ready (kwok); Pods bound to them run; and
//! kube-controller-manager computes disruption budgets and collects garbage.

use std::net::{Ipv4Addr, SocketAddr};
use std::time::{Duration, Instant};

use ichor_testenv::wait::eventually;
use ichor_testenv::workload::node_is_ready;
use ichor_testenv::{CertAndKey, Error, NodeRegistration, WorkloadControlPlane, WorkloadSpec};
use k8s_openapi::api::apps::v1::{Deployment, ReplicaSet};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Pod, Taint};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use kube::api::{DeleteParams, ListParams, ObjectMeta, PostParams};
use kube::{Api, Client};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde_json::json;

/// How long a controller or kwok may take to act on an object.
const ACT: Duration = Duration::from_secs(60);

/// A fresh Kubernetes CA, ECDSA P-256 like a Talos bundle's, with a subject of its own.
fn kubernetes_ca() -> CertAndKey {
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("CA key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("CA params");
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params
        .distinguished_name
        .push(DnType::OrganizationName, "kubernetes");
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    let cert = params.self_signed(&key).expect("self-signed CA");
    CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A client certificate for `user` in `group`, signed by `ca` here, without the crate's help:
/// what minting an admin kubeconfig from a secrets bundle does.
fn client_cert(ca: &CertAndKey, user: &str, group: &str) -> CertAndKey {
    let issuer = Issuer::from_ca_cert_pem(
        &ca.cert_pem,
        KeyPair::from_pem(&ca.key_pem).expect("CA key"),
    )
    .expect("issuer");
    let key = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).expect("client key");
    let mut params = CertificateParams::new(Vec::<String>::new()).expect("client params");
    params.distinguished_name.push(DnType::CommonName, user);
    params
        .distinguished_name
        .push(DnType::OrganizationName, group);
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = params.signed_by(&key, &issuer).expect("client cert");
    CertAndKey {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    }
}

/// A cluster endpoint on port 6443 of an address of its own in 127.31.0.0/16, as a simulated
/// Talos cluster's would be.
fn endpoint() -> SocketAddr {
    let [a, b]: [u8; 2] = rand::random();
    SocketAddr::from((Ipv4Addr::new(127, 31, a, b.max(2)), 6443))
}

async fn start() -> (WorkloadControlPlane, CertAndKey) {
    let ca = kubernetes_ca();
    let spec = WorkloadSpec::new(endpoint(), ca.clone()).cluster_name("workload-test");
    let plane = WorkloadControlPlane::start(spec)
        .await
        .expect("workload control plane");
    (plane, ca)
}

fn meta(name: &str, namespace: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(namespace.into()),
        ..Default::default()
    }
}

async fn namespace(client: &Client, name: &str) {
    Api::<Namespace>::all(client.clone())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(name.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await
        .expect("create namespace");
}

#[tokio::test]
async fn serves_the_cluster_endpoint_with_the_cluster_ca_and_trusts_its_client_certificates() {
    let (plane, ca) = start().await;
    let endpoint = plane.endpoint();
    assert_eq!(plane.server(), format!("https://{endpoint}"));

    // An admin certificate minted outside the crate from the same CA: the apiserver's serving
    // certificate verifies against that CA alone, and `system:masters` may do anything.
    let admin = plane
        .client_with(&client_cert(&ca, "talos-admin", "system:masters"))
        .await
        .expect("client");
    let namespaces = Api::<Namespace>::all(admin.clone())
        .list(&ListParams::default())
        .await
        .expect("list namespaces as a bundle-minted admin");
    assert!(
        namespaces
            .items
            .iter()
            .any(|n| n.metadata.name.as_deref() == Some("kube-system"))
    );

    // The crate's own admin kubeconfig is signed by the same CA.
    assert!(
        plane
            .kubeconfig()
            .contains(&format!("server: {}", plane.server()))
    );
    Api::<Namespace>::all(plane.client())
        .get("default")
        .await
        .expect("read as the crate's admin");

    // A certificate from another CA is refused; one outside `system:masters` is only
    // authenticated, not authorised.
    let stranger = plane
        .client_with(&client_cert(&kubernetes_ca(), "mallory", "system:masters"))
        .await
        .expect("client");
    match Api::<Namespace>::all(stranger)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 401, "{status:?}"),
        other => panic!("a foreign CA's certificate must be refused, got {other:?}"),
    }
    let nobody = plane
        .client_with(&client_cert(&ca, "nobody", "ichor:nobody"))
        .await
        .expect("client");
    match Api::<Namespace>::all(nobody)
        .list(&ListParams::default())
        .await
    {
        Err(kube::Error::Api(status)) => assert_eq!(status.code, 403, "{status:?}"),
        other => panic!("an unprivileged user must be forbidden, got {other:?}"),
    }

    // Stopping kills every process and removes the folder.
    let pids = plane.pids();
    let dir = plane.dir().to_path_buf();
    plane.stop();
    let deadline = Instant::now() + Duration::from_secs(20);
    while (dir.exists() || pids.iter().any(|p| alive(*p))) && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(!dir.exists(), "folder removed");
    for pid in pids {
        assert!(!alive(pid), "process {pid} stopped");
    }
}

/// Whether `pid` is a live (not zombie) process.
fn alive(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
        stat.rsplit_once(')')
            .and_then(|(_, rest)| rest.split_whitespace().next())
            .is_some_and(|state| state != "Z" && state != "X")
    })
}

#[tokio::test]
async fn registered_nodes_become_ready_pods_run_budgets_count_and_garbage_is_collected() {
    let (plane, _ca) = start().await;
    let client = plane.client();

    // A node registers as its kubelet would, a control-plane taint included; kwok makes it
    // Ready and the node lifecycle controller leaves no not-ready taint behind.
    let registration = NodeRegistration::new("worker-1")
        .label("node.kubernetes.io/instance-type", "simulated")
        .internal_ip("127.31.0.10".parse().expect("ip"))
        .os_image("Talos (v1.13.0)")
        .system_uuid("4c4c4544-0000-1000-8000-000000000001");
    plane
        .register_node(&registration)
        .await
        .expect("register node");
    plane
        .register_node(
            &NodeRegistration::new("cp-1")
                .label("node-role.kubernetes.io/control-plane", "")
                .taint(Taint {
                    key: "node-role.kubernetes.io/control-plane".into(),
                    effect: "NoSchedule".into(),
                    ..Default::default()
                }),
        )
        .await
        .expect("register control plane node");
    let node = plane
        .wait_node_ready("worker-1", ACT)
        .await
        .expect("kwok makes the node Ready");
    let labels = node.metadata.labels.clone().expect("labels");
    assert_eq!(labels["kubernetes.io/hostname"], "worker-1");
    assert_eq!(labels["node.kubernetes.io/instance-type"], "simulated");
    let info = node
        .status
        .as_ref()
        .and_then(|s| s.node_info.clone())
        .expect("node info");
    assert_eq!(info.os_image, "Talos (v1.13.0)");
    assert_eq!(info.system_uuid, "4c4c4544-0000-1000-8000-000000000001");
    plane
        .wait_node_ready("cp-1", ACT)
        .await
        .expect("control plane node Ready");
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(client.clone());
    eventually("the not-ready taint to be lifted", ACT, || async {
        let node = nodes.get("worker-1").await.ok()?;
        let taints = node.spec.and_then(|s| s.taints).unwrap_or_default();
        taints
            .iter()
            .all(|t| !t.key.starts_with("node.kubernetes.io/"))
            .then_some(())
    })
    .await;
    assert!(node_is_ready(&nodes.get("worker-1").await.expect("node")));

    // A Deployment whose Pods are bound to the node (there is no scheduler): the deployment
    // and replica-set controllers create them, kwok runs them.
    let ns = "apps";
    namespace(&client, ns).await;
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    let deployment: Deployment = serde_json::from_value(json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": "web"}},
            "template": {
                "metadata": {"labels": {"app": "web"}},
                "spec": {
                    "nodeName": "worker-1",
                    "containers": [{"name": "web", "image": "registry.invalid/web:1"}]
                }
            }
        }
    }))
    .expect("deployment");
    deployments
        .create(&PostParams::default(), &deployment)
        .await
        .expect("create deployment");
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let running = eventually("two running pods", ACT, || async {
        let list = pods
            .list(&ListParams::default().labels("app=web"))
            .await
            .ok()?;
        let running: Vec<Pod> = list
            .items
            .into_iter()
            .filter(|p| p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running"))
            .collect();
        (running.len() == 2).then_some(running)
    })
    .await;
    for pod in &running {
        let status = pod.status.as_ref().expect("status");
        assert!(status.pod_ip.is_some(), "kwok gives the pod an IP");
        assert_eq!(
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()),
            Some("worker-1")
        );
    }
    eventually(
        "the deployment to report two available replicas",
        ACT,
        || async {
            let d = deployments.get("web").await.ok()?;
            (d.status?.available_replicas? == 2).then_some(())
        },
    )
    .await;

    // The disruption controller counts the healthy pods for a budget.
    let budgets = Api::<PodDisruptionBudget>::namespaced(client.clone(), ns);
    let budget: PodDisruptionBudget = serde_json::from_value(json!({
        "apiVersion": "policy/v1",
        "kind": "PodDisruptionBudget",
        "metadata": {"name": "web", "namespace": ns},
        "spec": {"minAvailable": 1, "selector": {"matchLabels": {"app": "web"}}}
    }))
    .expect("budget");
    budgets
        .create(&PostParams::default(), &budget)
        .await
        .expect("create budget");
    eventually("the budget to allow one disruption", ACT, || async {
        let status = budgets.get("web").await.ok()?.status?;
        (status.current_healthy == Some(2) && status.disruptions_allowed == Some(1)).then_some(())
    })
    .await;

    // Garbage collection: a dependent whose owner is deleted goes with it…
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), ns);
    let owner = config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: meta("owner", ns),
                ..Default::default()
            },
        )
        .await
        .expect("create owner");
    let mut dependent_meta = meta("dependent", ns);
    dependent_meta.owner_references = Some(vec![OwnerReference {
        api_version: "v1".into(),
        kind: "ConfigMap".into(),
        name: "owner".into(),
        uid: owner.metadata.uid.clone().expect("owner uid"),
        ..Default::default()
    }]);
    config_maps
        .create(
            &PostParams::default(),
            &ConfigMap {
                metadata: dependent_meta,
                ..Default::default()
            },
        )
        .await
        .expect("create dependent");
    config_maps
        .delete("owner", &DeleteParams::default())
        .await
        .expect("delete owner");
    eventually("the dependent to be collected", ACT, || async {
        matches!(config_maps.get_opt("dependent").await, Ok(None)).then_some(())
    })
    .await;

    // …and deleting the Deployment takes its ReplicaSet and Pods (kwok lets deleted Pods go,
    // as a kubelet does once their containers stop).
    deployments
        .delete("web", &DeleteParams::background())
        .await
        .expect("delete deployment");
    let replica_sets = Api::<ReplicaSet>::namespaced(client.clone(), ns);
    eventually("the replica set and pods to be collected", ACT, || async {
        let sets = replica_sets.list(&ListParams::default()).await.ok()?;
        let left = pods.list(&ListParams::default()).await.ok()?;
        (sets.items.is_empty() && left.items.is_empty()).then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_stopped_apiserver_stops_answering_and_comes_back_with_its_objects_and_kubeconfig() {
    let (mut plane, ca) = start().await;
    let admin = plane
        .client_with(&client_cert(&ca, "ichor", "system:masters"))
        .await
        .expect("client");
    plane
        .register_node(&NodeRegistration::new("worker-1"))
        .await
        .expect("register");
    let [etcd, apiserver, ..] = plane.pids();

    plane.stop_apiserver().expect("stop the apiserver");
    assert!(!plane.apiserver_running());
    assert_eq!(plane.pids()[1], 0, "no apiserver pid while stopped");
    let nodes = Api::<k8s_openapi::api::core::v1::Node>::all(admin.clone());
    match nodes.get_opt("worker-1").await {
        Err(kube::Error::Api(status)) => panic!("a stopped API answered: {status:?}"),
        Err(_) => {}
        Ok(found) => panic!("a stopped API answered: {found:?}"),
    }
    assert!(alive(etcd), "etcd keeps running");
    assert!(!alive(apiserver), "the apiserver stopped");
    plane.stop_apiserver().expect("stopping twice is fine");

    plane.start_apiserver().await.expect("start the apiserver");
    assert!(plane.apiserver_running());
    // The same endpoint and certificates: a client made before the outage works again, and the
    // Node registered before it is still there.
    let node = eventually("worker-1 after the restart", ACT, || async {
        nodes.get_opt("worker-1").await.ok().flatten()
    })
    .await;
    assert_eq!(node.metadata.name.as_deref(), Some("worker-1"));
    plane
        .start_apiserver()
        .await
        .expect("starting a running one does nothing");
}

#[tokio::test]
async fn a_missing_workload_binary_fails_with_how_to_build_it() {
    let empty = tempfile::tempdir().expect("temporary folder");
    let spec = WorkloadSpec::new(endpoint(), kubernetes_ca()).assets_dir(empty.path());
    match WorkloadControlPlane::start(spec).await {
        Err(err @ Error::MissingAssets { .. }) => {
            let message = err.to_string();
            assert!(message.contains("kube-controller-manager"), "{message}");
            assert!(message.contains("kwok"), "{message}");
            assert!(message.contains("cargo xtask envtest-assets"), "{message}");
        }
        other => panic!("expected MissingAssets, got {other:?}"),
    }
}
