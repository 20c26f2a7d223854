//! The controller against a real apiserver and simulated Talos nodes: discovery finds the
//! machines, nothing is applied before approval, approved machines reach Ready, etcd has
//! exactly three voters, and the published talosconfig reaches every node. A TalosOperation
//! reconciled from a stale copy sends nothing the stored status says was sent (ADR 0055). A
//! talosconfig that cannot be written does not hold the bootstrap back (ADR 0057).

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::names::conditions;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_sim::{Hardware, SimNode, Stage as SimStage};
use ichor_talos::{Credentials, TalosClient};
use ichor_testenv::nets::MANAGER_LIFECYCLE;
use ichor_testenv::wait::eventually;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

fn credentials_from_talosconfig(text: &str, cluster: &str) -> Credentials {
    use base64::Engine as _;
    let value: serde_json::Value = serde_saphyr::from_str(text).expect("talosconfig");
    let context = &value["contexts"][cluster];
    let field = |k: &str| {
        String::from_utf8(
            base64::engine::general_purpose::STANDARD
                .decode(context[k].as_str().expect("field"))
                .expect("base64"),
        )
        .expect("utf8")
    };
    Credentials {
        ca_pem: field("ca"),
        cert_pem: field("crt"),
        key_pem: field("key"),
    }
}

async fn run_lifecycle(net: u8, talos_version: &str, cni: &str) {
    let (env, ns) = support::plane("lifecycle").await;
    let mut nodes = Vec::new();
    for host in 1..=5u8 {
        let addr = SocketAddr::from(([127, 0, net, host], 50000));
        nodes.push(
            SimNode::start_with(
                addr,
                talos_version,
                Hardware::vm(u32::from(net) * 256 + u32::from(host)),
            )
            .await
            .expect("sim node"),
        );
    }
    let cluster = TalosCluster::test("lab")
        .namespace(&ns)
        .talos(talos_version)
        .endpoint(&format!("https://127.0.{net}.1:6443"))
        .control_planes(3)
        .cni(cni.parse().expect("a CNI preset"))
        .discovery(&[format!("127.0.{net}.0/24")], "10s")
        .install_disk("/dev/vda")
        .build();
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    clusters
        .create(&PostParams::default(), &cluster)
        .await
        .expect("create cluster");

    let (stop_tx, manager, metrics) = support::start_manager_with_metrics(&env);

    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);
    eventually(
        "five discovered machines",
        Duration::from_secs(60),
        || async {
            machines
                .list(&ListParams::default())
                .await
                .map(|l| l.items.len())
                .unwrap_or(0)
                == 5
        },
    )
    .await;
    // The manager had its chance: discovery recorded every machine's hardware, and the machine
    // controller reconciled each of them (each machine at least once after it was created).
    eventually(
        "every machine observed",
        Duration::from_secs(60),
        || async {
            machines.list(&ListParams::default()).await.is_ok_and(|l| {
                l.items.iter().all(|m| {
                    m.status
                        .as_ref()
                        .is_some_and(|s| s.inventory.hardware.is_some())
                })
            })
        },
    )
    .await;
    eventually(
        "five machine reconciles",
        Duration::from_secs(60),
        || async {
            let n = support::reconciles(&metrics, "TalosMachine");
            if n >= 5 {
                Ok(n)
            } else {
                Err(format!("{n} reconciles"))
            }
        },
    )
    .await;
    for node in &nodes {
        assert_eq!(
            node.stage().await,
            SimStage::Maintenance,
            "nothing applied before approval"
        );
        assert_eq!(
            node.calls("ApplyConfiguration"),
            0,
            "nothing sent before approval"
        );
    }

    // Approve as a person would: a patch per machine.
    for machine in machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        let address = machine.spec.endpoints[0].clone();
        let host: u8 = address
            .rsplit('.')
            .next()
            .and_then(|h| h.parse().ok())
            .expect("host");
        let (role, hostname) = if host <= 3 {
            ("controlplane", format!("cp-{host}"))
        } else {
            ("worker", format!("worker-{host}"))
        };
        machines
            .patch(
                &machine.name_any(),
                &PatchParams::default(),
                &Patch::Merge(json!({"spec": {"approvalState": "approved", "role": role, "hostname": hostname}})),
            )
            .await
            .expect("approve");
    }

    eventually("the cluster Ready", Duration::from_secs(120), || async {
        clusters
            .get("lab")
            .await
            .ok()
            .and_then(|c| c.status)
            .is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::READY
                        && c.status == ichor_api::common::ConditionStatus::True
                })
            })
    })
    .await;

    let status = clusters
        .get("lab")
        .await
        .expect("cluster")
        .status
        .expect("status");
    let talosconfig = ichor_manager::secrets::read(
        &env.client(),
        &ns,
        status
            .core
            .talosconfig_secret
            .as_deref()
            .expect("talosconfig published"),
        "talosconfig",
    )
    .await
    .expect("read")
    .expect("talosconfig");
    let credentials = credentials_from_talosconfig(&talosconfig, "lab");
    for node in &nodes {
        let client = TalosClient::connect(&node.addr().to_string(), &credentials)
            .await
            .expect("the talosconfig reaches every node");
        assert_eq!(client.version().await.expect("version"), talos_version);
    }
    let cp = TalosClient::connect(&nodes[0].addr().to_string(), &credentials)
        .await
        .expect("cp");
    let members = cp.etcd_members(false).await.expect("members");
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(members.iter().all(|m| !m.learner));
    for node in &nodes[1..3] {
        let other = TalosClient::connect(&node.addr().to_string(), &credentials)
            .await
            .expect("cp");
        let mut theirs: Vec<u64> = other
            .etcd_members(false)
            .await
            .expect("members")
            .iter()
            .map(|m| m.id)
            .collect();
        let mut ours: Vec<u64> = members.iter().map(|m| m.id).collect();
        theirs.sort_unstable();
        ours.sort_unstable();
        assert_eq!(theirs, ours, "exactly one etcd cluster");
    }
    assert!(
        status.core.kubeconfig_secret.is_some(),
        "the workload kubeconfig is published"
    );

    let _ = stop_tx.send(());
    let _ = manager.await;
    for node in nodes {
        node.stop().await;
    }
}

/// Runs `test` as the manager binary runs its reconciles: on a two-worker runtime whose threads
/// have the binary's 8 MiB stacks (ADR 0078), not a test runtime's 2 MiB, since these tests run
/// the whole manager in-process; a panic of `test` fails the test.
fn on_manager_stacks<F>(test: F)
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_stack_size(8 * 1024 * 1024)
        .enable_all()
        .build()
        .expect("a runtime");
    if let Err(error) = runtime.block_on(async move { tokio::spawn(test).await }) {
        std::panic::resume_unwind(error.into_panic());
    }
}

#[test]
fn discovered_machines_become_a_ready_cluster_on_contract_1_14() {
    on_manager_stacks(discovered_machines_become_a_ready_cluster_on_contract_1_14_body());
}

async fn discovered_machines_become_a_ready_cluster_on_contract_1_14_body() {
    run_lifecycle(MANAGER_LIFECYCLE.net(0), "v1.14.1", "flannel").await;
}

#[test]
fn contract_1_13_with_cni_none_still_joins_every_control_plane() {
    on_manager_stacks(contract_1_13_with_cni_none_still_joins_every_control_plane_body());
}

async fn contract_1_13_with_cni_none_still_joins_every_control_plane_body() {
    run_lifecycle(MANAGER_LIFECYCLE.net(1), "v1.13.9", "none").await;
}

/// The controller's copy of a TalosOperation can be a write behind the manager's own: here it
/// shows the reboot only intended while the stored status says it was sent. Reconciled from
/// that copy, nothing is sent again and the stored step stays sent (ADR 0055); with the stored
/// status saying intended, the same reconcile does send it, once.
#[test]
fn an_operation_reconciled_from_a_stale_copy_sends_nothing_the_stored_status_says_was_sent() {
    on_manager_stacks(an_operation_reconciled_from_a_stale_copy_sends_nothing_the_stored_status_says_was_sent_body());
}

async fn an_operation_reconciled_from_a_stale_copy_sends_nothing_the_stored_status_says_was_sent_body()
 {
    use std::sync::Arc;

    use ichor_api::TalosOperation;
    use ichor_api::names::{labels, secrets as keys};
    use ichor_api::operation::{NodeProgress, OperationAction};
    use ichor_manager::{Context, Metrics, Settings};
    use ichor_testenv::nets::MANAGER_OPERATION;
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::ObjectMeta;

    let (env, ns) = support::plane("operation").await;
    let bundle =
        ichor_render::SecretsBundle::generate(ichor_render::Contract::V1_14).expect("bundle");
    let address = MANAGER_OPERATION.ip(0, 1);
    let endpoint = format!("https://{address}:6443");
    let cluster = TalosCluster::test("lab")
        .namespace(&ns)
        .endpoint(&endpoint)
        .control_planes(1)
        .build();
    let config = ichor_render::render(&ichor_render::RenderInput::plain(
        "lab",
        &cluster.spec,
        ichor_api::common::Role::ControlPlane,
        &bundle,
    ))
    .expect("render")
    .yaml;
    let node = SimNode::start_configured(
        SocketAddr::from((address, 50000)),
        "v1.14.1",
        Hardware::vm(6601),
        &config,
    )
    .await
    .expect("a running node");
    Api::<Secret>::namespaced(env.client(), &ns)
        .create(
            &PostParams::default(),
            &Secret {
                metadata: ObjectMeta {
                    name: Some("lab-secrets".into()),
                    ..Default::default()
                },
                data: Some(
                    [(
                        keys::BUNDLE_KEY.to_owned(),
                        ByteString(bundle.to_yaml().expect("yaml").into_bytes()),
                    )]
                    .into(),
                ),
                ..Default::default()
            },
        )
        .await
        .expect("the bundle");
    let cluster = Api::<TalosCluster>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &cluster)
        .await
        .expect("cluster");
    support::create_machine(
        &env,
        &ns,
        support::lab_control_plane(&ns, &address.to_string())
            .label(labels::MACHINE_UUID, &node.hardware().uuid),
    )
    .await;
    // Configured, as every machine an operation chooses is (one not configured, or no longer,
    // is sent nothing).
    Api::<TalosMachine>::namespaced(env.client(), &ns)
        .patch_status(
            "cp-1",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"appliedConfigHash": "sha256:0"}})),
        )
        .await
        .expect("configured");

    let ctx = Arc::new(Context::new(
        env.client(),
        Settings::default(),
        Arc::new(Metrics::default()),
    ));
    let credentials = ctx
        .node_credentials(&cluster, &bundle)
        .expect("credentials");
    let boot_id = TalosClient::connect(&node.addr().to_string(), &credentials)
        .await
        .expect("the node answers the cluster's credentials")
        .boot_id()
        .await
        .expect("boot id");
    let operations = Api::<TalosOperation>::namespaced(env.client(), &ns);
    operations
        .create(
            &PostParams::default(),
            &TalosOperation::test("reboot", OperationAction::Reboot)
                .cluster("lab")
                .machine("cp-1")
                .build(),
        )
        .await
        .expect("operation");
    // In whole seconds, as the API keeps a time.
    let now =
        k8s_openapi::jiff::Timestamp::from_second(k8s_openapi::jiff::Timestamp::now().as_second())
            .expect("now")
            .to_string();
    let step = |progress: serde_json::Value| {
        json!({"status": {
            "phase": "Running",
            "startedAt": now,
            "nodes": [{
                "machine": "cp-1",
                "phase": "Running",
                "bootIdBefore": boot_id,
                "progress": progress,
            }],
        }})
    };
    let record = |progress: serde_json::Value| {
        let operations = operations.clone();
        let patch = step(progress);
        async move {
            operations
                .patch_status("reboot", &PatchParams::default(), &Patch::Merge(patch))
                .await
                .expect("status")
        }
    };
    // The intent recorded: what the controller's copy still shows.
    let stale = record(json!({"step": "intended"})).await;
    // The reboot recorded sent: what is stored.
    record(json!({"step": "sent", "sentAt": now})).await;

    ichor_manager::controller::operation::reconcile(Arc::new(stale.clone()), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    assert_eq!(
        node.calls("Reboot"),
        0,
        "the reboot stored as sent is not sent again"
    );
    let stored = operations.get("reboot").await.expect("operation");
    let stored = stored.status.expect("status");
    assert!(
        matches!(stored.run.nodes[0].progress, NodeProgress::Sent { .. }),
        "the stored step stays sent: {:?}",
        stored.run.nodes[0]
    );

    // The same stale copy, with the stored status saying intended: the reboot goes, once.
    record(json!({"step": "intended"})).await;
    ichor_manager::controller::operation::reconcile(Arc::new(stale), Arc::clone(&ctx))
        .await
        .expect("reconcile");
    assert_eq!(node.calls("Reboot"), 1, "the intended reboot is sent");
    node.stop().await;
}

/// The API of `doc`, an admissionregistration.k8s.io/v1 object.
fn admission_api(
    client: &kube::Client,
    doc: &kube::api::DynamicObject,
) -> Api<kube::api::DynamicObject> {
    use kube::api::{ApiResource, GroupVersionKind};
    let kind = &doc.types.as_ref().expect("kind").kind;
    let gvk = GroupVersionKind::gvk("admissionregistration.k8s.io", "v1", kind);
    Api::all_with(client.clone(), &ApiResource::from_gvk(&gvk))
}

/// A ValidatingAdmissionPolicy (and its binding) refusing every write of the Secret `name`.
async fn refuse_writes_of(client: &kube::Client, name: &str) -> [kube::api::DynamicObject; 2] {
    use kube::api::DynamicObject;
    let policy = format!("refuse-{name}");
    let docs: [DynamicObject; 2] = [
        serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicy",
            "metadata": {"name": policy},
            "spec": {
                "failurePolicy": "Fail",
                "matchConstraints": {"resourceRules": [{
                    "apiGroups": [""], "apiVersions": ["v1"],
                    "operations": ["CREATE", "UPDATE"], "resources": ["secrets"],
                }]},
                "validations": [{
                    "expression": format!("object.metadata.name != '{name}'"),
                    "message": "refused by the test",
                }],
            },
        }))
        .expect("a policy"),
        serde_json::from_value(json!({
            "apiVersion": "admissionregistration.k8s.io/v1",
            "kind": "ValidatingAdmissionPolicyBinding",
            "metadata": {"name": policy},
            "spec": {"policyName": policy, "validationActions": ["Deny"]},
        }))
        .expect("a binding"),
    ];
    for doc in &docs {
        admission_api(client, doc)
            .create(&PostParams::default(), doc)
            .await
            .expect("create");
    }
    docs
}

#[test]
fn a_talosconfig_that_cannot_be_written_does_not_hold_the_bootstrap_back() {
    on_manager_stacks(a_talosconfig_that_cannot_be_written_does_not_hold_the_bootstrap_back_body());
}

async fn a_talosconfig_that_cannot_be_written_does_not_hold_the_bootstrap_back_body() {
    use ichor_api::names::{labels, reasons};
    use ichor_testenv::nets::MANAGER_INDEPENDENT;
    use k8s_openapi::api::core::v1::Secret;
    use kube::api::{DeleteParams, ObjectMeta};

    let (env, ns) = support::plane("independent").await;
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    // The talosconfig's Secret cannot be written: shown refused before the manager starts
    // (a dry run: admission runs, nothing is stored).
    let docs = refuse_writes_of(&env.client(), "lab-talosconfig").await;
    let probe = Secret {
        metadata: ObjectMeta {
            name: Some("lab-talosconfig".into()),
            ..Default::default()
        },
        ..Default::default()
    };
    eventually("the policy in force", Duration::from_secs(30), || async {
        let dry_run = PostParams {
            dry_run: true,
            ..PostParams::default()
        };
        secrets
            .create(&dry_run, &probe)
            .await
            .is_err_and(|e| e.to_string().contains("refused by the test"))
    })
    .await;

    let address = MANAGER_INDEPENDENT.ip(0, 1);
    let node = SimNode::start_with(
        SocketAddr::from((address, 50000)),
        "v1.14.1",
        Hardware::vm(21801),
    )
    .await
    .expect("a maintenance node");
    Api::<TalosCluster>::namespaced(env.client(), &ns)
        .create(
            &PostParams::default(),
            &TalosCluster::test("lab")
                .namespace(&ns)
                .endpoint(&format!("https://{address}:6443"))
                .control_planes(1)
                .install_disk("/dev/vda")
                .build(),
        )
        .await
        .expect("cluster");
    support::create_machine(
        &env,
        &ns,
        support::lab_control_plane(&ns, &address.to_string())
            .fingerprint(&node.fingerprint())
            .label(labels::MACHINE_UUID, &node.hardware().uuid),
    )
    .await;
    let (stop_tx, manager) = support::start_manager(&env);

    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    let condition = |type_: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .get("lab")
                .await
                .ok()?
                .status?
                .conditions
                .into_iter()
                .find(|c| c.type_ == type_)
        }
    };
    eventually(
        "bootstrapped, the talosconfig refused",
        Duration::from_secs(120),
        || async {
            condition(conditions::BOOTSTRAPPED)
                .await
                .is_some_and(|c| c.status == ichor_api::common::ConditionStatus::True)
        },
    )
    .await;
    assert!(
        secrets
            .get_opt("lab-talosconfig")
            .await
            .expect("read")
            .is_none(),
        "never written"
    );

    // Allowed again: published at a later reconcile.
    for doc in docs.iter().rev() {
        admission_api(&env.client(), doc)
            .delete(&doc.name_any(), &DeleteParams::default())
            .await
            .expect("delete");
    }
    eventually("published", Duration::from_secs(120), || async {
        condition(conditions::CREDENTIALS_PUBLISHED)
            .await
            .is_some_and(|c| c.reason == reasons::PUBLISHED)
            && secrets
                .get_opt("lab-talosconfig")
                .await
                .is_ok_and(|s| s.is_some())
    })
    .await;

    let _ = stop_tx.send(());
    manager.await.expect("the manager stops");
    node.stop().await;
}
