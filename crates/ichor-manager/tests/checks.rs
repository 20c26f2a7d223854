//! What the manager refuses and reports: a secretsRef naming no Secret, a node older than the
//! cluster's contract, one SMBIOS UUID answering with two certificates, pending and rejected
//! machines; and the generated bundle Secret carries no owner reference.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::names::{conditions, reasons};
use ichor_api::testing::ClusterBuilder;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_sim::{Hardware, SimNode, Stage};
use ichor_testenv::nets::MANAGER_CHECKS;
use ichor_testenv::wait::eventually;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A one-control-plane cluster `name` discovering 127.0.`net`.0/24.
fn cluster(ns: &str, name: &str, net: u8) -> ClusterBuilder {
    TalosCluster::test(name)
        .namespace(ns)
        .endpoint(&format!("https://127.0.{net}.1:6443"))
        .discovery(&[format!("127.0.{net}.0/24")], "10s")
        .install_disk("/dev/vda")
}

fn condition(c: &TalosCluster, type_: &str) -> Option<(String, String)> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == type_)
        .map(|x| (x.reason.clone(), x.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_reports() {
    let (env, ns) = support::plane("checks").await;
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);

    // An old node, and two machines sharing one SMBIOS UUID.
    let old = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(0, 1), 50000)),
        "v1.13.9",
        Hardware::vm(6201),
    )
    .await
    .expect("old node");
    let twin_a = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(1, 1), 50000)),
        "v1.14.1",
        Hardware::vm(6301),
    )
    .await
    .expect("twin");
    let twin_b = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(1, 2), 50000)),
        "v1.14.1",
        Hardware::vm(6301),
    )
    .await
    .expect("twin");

    for c in [
        cluster(&ns, "old", MANAGER_CHECKS.net(0)).build(),
        cluster(&ns, "twins", MANAGER_CHECKS.net(1)).build(),
        cluster(&ns, "missing", MANAGER_CHECKS.net(2))
            .secrets("nope")
            .build(),
    ] {
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    let (stop_tx, manager) = support::start_manager(&env);

    // secretsRef naming nothing: SecretsReady false, saying what to do.
    eventually(
        "SecretsBundleUnavailable",
        Duration::from_secs(60),
        || async {
            clusters
                .get("missing")
                .await
                .ok()
                .and_then(|c| condition(&c, conditions::SECRETS_READY))
                .is_some_and(|(reason, message)| {
                    reason == reasons::SECRETS_BUNDLE_UNAVAILABLE && message.contains("nope")
                })
        },
    )
    .await;

    // A generated bundle outlives its cluster: no owner reference.
    eventually("the generated bundle", Duration::from_secs(60), || async {
        Api::<Secret>::namespaced(env.client(), &ns)
            .get_opt("old-secrets")
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    let bundle = Api::<Secret>::namespaced(env.client(), &ns)
        .get("old-secrets")
        .await
        .expect("bundle");
    assert!(
        bundle
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // One UUID, two certificates: reported, not recorded.
    eventually(
        "the UUID conflict event",
        Duration::from_secs(60),
        || async {
            Api::<Event>::namespaced(env.client(), &ns)
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.message
                            .as_deref()
                            .unwrap_or_default()
                            .contains("different certificates")
                    })
                })
        },
    )
    .await;
    let recorded = machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    assert!(
        recorded.iter().all(|m| m.spec.cluster_ref.name != "twins"),
        "no record for a conflicting UUID"
    );

    // A node older than the contract is refused before anything is applied.
    eventually(
        "the old machine discovered",
        Duration::from_secs(60),
        || async {
            machines
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.iter().any(|m| m.spec.cluster_ref.name == "old"))
        },
    )
    .await;
    let name = machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .find(|m| m.spec.cluster_ref.name == "old")
        .expect("old machine")
        .name_any();
    let ready_reason = |name: String| {
        let machines = machines.clone();
        async move {
            machines
                .get(&name)
                .await
                .ok()
                .and_then(|m| m.status)
                .and_then(|s| {
                    s.conditions
                        .into_iter()
                        .find(|c| c.type_ == conditions::READY)
                })
                .map(|c| c.reason)
        }
    };
    eventually("AwaitingApproval", Duration::from_secs(60), || async {
        ready_reason(name.clone()).await.as_deref() == Some(reasons::AWAITING_APPROVAL)
    })
    .await;
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "approved", "role": "controlplane"}})),
        )
        .await
        .expect("approve");
    eventually("TalosVersionTooOld", Duration::from_secs(60), || async {
        machines
            .get(&name)
            .await
            .ok()
            .and_then(|m| m.status)
            .is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::READY && c.reason == reasons::TALOS_VERSION_TOO_OLD
                })
            })
    })
    .await;
    assert_eq!(old.stage().await, Stage::Maintenance, "nothing applied");
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "rejected"}})),
        )
        .await
        .expect("reject");
    eventually("Rejected", Duration::from_secs(60), || async {
        ready_reason(name.clone()).await.as_deref() == Some(reasons::REJECTED)
    })
    .await;

    let _ = stop_tx.send(());
    let _ = manager.await;
    for node in [old, twin_a, twin_b] {
        node.stop().await;
    }
}

/// The config a control plane of a cluster behind `endpoint` runs, from `bundle`.
fn running_config(bundle: &ichor_render::SecretsBundle, endpoint: &str) -> String {
    let spec = TalosCluster::test("again").endpoint(endpoint).spec();
    let empty = std::collections::BTreeMap::new();
    ichor_render::render(&ichor_render::RenderInput {
        cluster_name: "again",
        cluster: &spec,
        role: ichor_api::common::Role::ControlPlane,
        hostname: None,
        install: None,
        cert_sans: &[],
        node_labels: &empty,
        node_taints: &empty,
        patches: &[],
        bundle,
    })
    .expect("render")
    .yaml
}

/// Whether an Event with `reason` whose note contains `needle` was recorded in `ns`.
async fn event_seen(env: &ichor_testenv::TestEnv, ns: &str, reason: &str, needle: &str) -> bool {
    Api::<Event>::namespaced(env.client(), ns)
        .list(&ListParams::default())
        .await
        .is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().unwrap_or_default().contains(needle)
            })
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_secret_is_never_taken_over_and_running_nodes_get_no_new_bundle() {
    use ichor_api::names::{labels, secrets as keys};
    use k8s_openapi::ByteString;
    use kube::api::{DeleteParams, ObjectMeta};

    let (env, ns) = support::plane("published").await;
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    let secret = |name: &str, key: &str, value: &[u8]| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([(key.to_owned(), ByteString(value.to_vec()))].into()),
        ..Default::default()
    };
    // A user's Secret under the name the talosconfig of `lab` is published under.
    let users = secrets
        .create(
            &PostParams::default(),
            &secret("lab-talosconfig", keys::TALOSCONFIG_KEY, b"mine"),
        )
        .await
        .expect("the user's Secret");
    // A node that already runs at the endpoint of `again`, a cluster created anew without its
    // status or its bundle Secret.
    let bundle =
        ichor_render::SecretsBundle::generate(ichor_render::Contract::V1_14).expect("bundle");
    let running = MANAGER_CHECKS.ip(2, 9);
    let endpoint = format!("https://{running}:6443");
    let node = SimNode::start_configured(
        SocketAddr::from((running, 50000)),
        "v1.14.1",
        Hardware::vm(6409),
        &running_config(&bundle, &endpoint),
    )
    .await
    .expect("a running node");
    for c in [
        TalosCluster::test("lab")
            .namespace(&ns)
            .endpoint(&format!("https://{}:6443", MANAGER_CHECKS.ip(2, 8)))
            .build(),
        TalosCluster::test("again")
            .namespace(&ns)
            .endpoint(&endpoint)
            .build(),
    ] {
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    let (stop_tx, manager) = support::start_manager(&env);

    // The name is taken: said on the cluster and in an Event, the Secret left as it was.
    let reason_of = |name: &'static str, type_: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .get(name)
                .await
                .ok()
                .and_then(|c| condition(&c, type_))
        }
    };
    eventually("SecretNameTaken", Duration::from_secs(60), || async {
        reason_of("lab", conditions::CREDENTIALS_PUBLISHED)
            .await
            .is_some_and(|(reason, message)| {
                reason == reasons::SECRET_NAME_TAKEN && message.contains("lab-talosconfig")
            })
    })
    .await;
    eventually("its Event", Duration::from_secs(30), || {
        event_seen(&env, &ns, reasons::SECRET_NAME_TAKEN, "lab-talosconfig")
    })
    .await;
    let after = secrets.get("lab-talosconfig").await.expect("still there");
    assert_eq!(
        after.metadata.resource_version, users.metadata.resource_version,
        "never written"
    );
    assert_eq!(after.data, users.data);
    assert!(after.metadata.owner_references.is_none());

    // Nodes that run: no bundle generated, the address named, and what to do.
    let address = running.to_string();
    eventually(
        "SecretsBundleNotGenerated",
        Duration::from_secs(60),
        || async {
            reason_of("again", conditions::SECRETS_READY)
                .await
                .is_some_and(|(reason, message)| {
                    reason == reasons::SECRETS_BUNDLE_NOT_GENERATED
                        && message.contains(&address)
                        && message.contains("again-secrets")
                })
        },
    )
    .await;
    eventually("its Event", Duration::from_secs(30), || {
        event_seen(&env, &ns, reasons::SECRETS_BUNDLE_NOT_GENERATED, &address)
    })
    .await;
    assert!(
        secrets
            .get_opt("again-secrets")
            .await
            .expect("read")
            .is_none(),
        "no bundle generated"
    );

    // The name freed: Ichor publishes its own, labelled and owned by the cluster.
    secrets
        .delete("lab-talosconfig", &DeleteParams::default())
        .await
        .expect("free the name");
    let uid = clusters.get("lab").await.expect("lab").uid();
    eventually("published", Duration::from_secs(60), || async {
        let published = secrets.get_opt("lab-talosconfig").await.ok().flatten();
        let ours = published.is_some_and(|s| {
            s.labels().get(labels::PUBLISHED).map(String::as_str) == Some("true")
                && s.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref() && o.controller == Some(true))
        });
        ours && reason_of("lab", conditions::CREDENTIALS_PUBLISHED)
            .await
            .is_some_and(|(reason, _)| reason == reasons::PUBLISHED)
    })
    .await;

    // The bundle restored: the cluster uses it.
    let yaml = bundle.to_yaml().expect("yaml");
    secrets
        .create(
            &PostParams::default(),
            &secret("again-secrets", keys::BUNDLE_KEY, yaml.as_bytes()),
        )
        .await
        .expect("restore the bundle");
    eventually("BundleValid", Duration::from_secs(60), || async {
        reason_of("again", conditions::SECRETS_READY)
            .await
            .is_some_and(|(reason, _)| reason == reasons::BUNDLE_VALID)
    })
    .await;

    let _ = stop_tx.send(());
    let _ = manager.await;
    node.stop().await;
}
