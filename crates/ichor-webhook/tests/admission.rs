//! The webhook called by a real kube-apiserver over TLS, with the CA the webhook wrote into
//! the webhook configuration, and requiring the client certificate the apiserver presents:
//! unsafe deletes and updates are refused at the door, concurrent deletes are serialized, and
//! safe ones pass. A review POSTed to the port by anyone else, or one that names a machine
//! other than the live one, reserves nothing.

use std::time::Duration;

use ichor_api::common::Role as MachineRole;
use ichor_api::machine::ApprovalState;
use ichor_api::names::{annotations, reasons};
use ichor_api::operation::{OperationAction, TalosOperation};
use ichor_api::testing::OperationBuilder;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_testenv::TestEnv;
use ichor_webhook::certs::CA_CERT_KEY;
use ichor_webhook::{
    CERT_SECRET, CertSettings, ClientAuth, Settings, WEBHOOK_CONFIGURATION, WEBHOOK_PATH,
};
use k8s_openapi::api::admissionregistration::v1::{
    ValidatingWebhookConfiguration, WebhookClientConfig,
};
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::api::rbac::v1::{
    ClusterRole, ClusterRoleBinding, Role, RoleBinding, RoleRef, Subject,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::LabelSelector;
use k8s_openapi::jiff::Timestamp;
use kube::Api;
use kube::api::{DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use serde_json::json;
use support::{api, create_machine, machine_review, post_review};

mod support;

/// Runs the webhook as its own user, bound to exactly the shipped ClusterRole and Role (the
/// Role's rules applied in the test namespace).
async fn webhook_client(env: &TestEnv, ns: &str) -> kube::Client {
    let user = format!("system:serviceaccount:{ns}:ichor-webhook");
    let admin = env.client();
    let role = ichor_api::admission::webhook_cluster_role();
    Api::<ClusterRole>::all(admin.clone())
        .create(&PostParams::default(), &role)
        .await
        .expect("cluster role");
    let subject = Subject {
        kind: "User".into(),
        name: user.clone(),
        api_group: Some("rbac.authorization.k8s.io".into()),
        ..Default::default()
    };
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(
            &PostParams::default(),
            &ClusterRoleBinding {
                metadata: kube::api::ObjectMeta {
                    name: Some(format!("ichor-webhook-{ns}")),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "ClusterRole".into(),
                    name: "ichor-webhook".into(),
                },
                subjects: Some(vec![subject.clone()]),
            },
        )
        .await
        .expect("cluster role binding");
    Api::<Role>::namespaced(admin.clone(), ns)
        .create(
            &PostParams::default(),
            &ichor_api::admission::webhook_role(ns),
        )
        .await
        .expect("role");
    Api::<RoleBinding>::namespaced(admin, ns)
        .create(
            &PostParams::default(),
            &RoleBinding {
                metadata: kube::api::ObjectMeta {
                    name: Some("ichor-webhook".into()),
                    ..Default::default()
                },
                role_ref: RoleRef {
                    api_group: Some("rbac.authorization.k8s.io".into()),
                    kind: "Role".into(),
                    name: "ichor-webhook".into(),
                },
                subjects: Some(vec![subject]),
            },
        )
        .await
        .expect("role binding");
    env.client_as(&user, None).await.expect("webhook client")
}

/// The shipped webhook configuration, calling `url` instead of the in-cluster Service, with an
/// empty `caBundle`: the webhook injects its own CA.
async fn register(env: &TestEnv, url: &str) {
    let mut config = ichor_api::admission::validating_webhook_configuration();
    for webhook in config.webhooks.iter_mut().flatten() {
        webhook.client_config = WebhookClientConfig {
            url: Some(url.to_owned()),
            ..Default::default()
        };
    }
    Api::<ValidatingWebhookConfiguration>::all(env.client())
        .create(&PostParams::default(), &config)
        .await
        .expect("webhook configuration");
}

/// A private control plane with the CRDs, a namespace, a running webhook registered with an
/// empty `caBundle` — the webhook injects its own CA — and requiring the client certificate
/// the apiserver presents to webhooks.
async fn setup() -> (TestEnv, String, ichor_webhook::Running) {
    let env = TestEnv::private().await.expect("private control plane");
    env.install_crds(ichor_api::crds()).await.expect("CRDs");
    let ns = env.namespace("webhook").await.expect("namespace");
    let client_auth = ClientAuth::from_pem_file(&env.connection().webhook_client_ca_file())
        .expect("the apiserver's webhook client CA");
    let running = ichor_webhook::start(
        webhook_client(&env, &ns).await,
        Settings {
            bind: ([127, 0, 0, 1], 0).into(),
            certs: CertSettings {
                namespace: ns.clone(),
                service: "ichor-webhook".into(),
                pod_ip: [127, 0, 0, 1].into(),
                secret: CERT_SECRET.into(),
                webhook_configuration: WEBHOOK_CONFIGURATION.into(),
                leaf_validity: Duration::from_secs(24 * 3600),
                renew_before: Duration::from_secs(3600),
            },
            refresh: Duration::from_millis(500),
            client_auth: Some(client_auth),
        },
    )
    .await
    .expect("webhook starts");
    register(
        &env,
        &format!("https://127.0.0.1:{}{WEBHOOK_PATH}", running.addr().port()),
    )
    .await;
    // The CA the webhook wrote reaches the configuration.
    let secret = Api::<Secret>::namespaced(env.client(), &ns)
        .get(CERT_SECRET)
        .await
        .expect("the webhook created its CA Secret");
    let ca = secret.data.expect("data")[CA_CERT_KEY].0.clone();
    let configs: Api<ValidatingWebhookConfiguration> = Api::all(env.client());
    let deadline = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let config = configs.get(WEBHOOK_CONFIGURATION).await.expect("config");
        let bundle = config.webhooks.expect("webhooks")[0]
            .client_config
            .ca_bundle
            .clone()
            .map(|b| b.0);
        if bundle.as_ref() == Some(&ca) {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the CA was never injected"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The apiserver picks the new caBundle up within moments: probe with a delete the
    // webhook allows until the call goes through.
    let machines = api(&env, &ns, "TalosMachine");
    for attempt in 0.. {
        let probe = format!("probe-{attempt}");
        create_machine(&env, &ns, TalosMachine::test(&probe).worker(), false).await;
        match delete(&machines, &probe).await {
            Ok(()) => break,
            Err(e) => {
                assert!(attempt < 50, "the apiserver never reached the webhook: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
    (env, ns, running)
}

async fn create_cluster(env: &TestEnv, ns: &str, count: i32) {
    let cluster = TalosCluster::test("lab").control_planes(count).json();
    let object: DynamicObject = serde_json::from_value(cluster).expect("cluster");
    api(env, ns, "TalosCluster")
        .create(&PostParams::default(), &object)
        .await
        .expect("create cluster");
}

/// Three applied, approved control planes, annotated for deletion.
async fn three_control_planes(env: &TestEnv, ns: &str) {
    create_cluster(env, ns, 3).await;
    for name in ["cp-1", "cp-2", "cp-3"] {
        create_machine(
            env,
            ns,
            TalosMachine::test(name)
                .control_plane()
                .approved()
                .allow_delete(),
            true,
        )
        .await;
    }
}

/// Deletes an object; the refusal message, if refused.
async fn delete(api: &Api<DynamicObject>, name: &str) -> Result<(), String> {
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err(status.message),
        Err(other) => Err(other.to_string()),
    }
}

#[tokio::test]
async fn unsafe_deletes_and_updates_are_refused_at_the_door() {
    let (env, ns, running) = setup().await;
    create_cluster(&env, &ns, 3).await;
    let machines = api(&env, &ns, "TalosMachine");
    for (name, applied) in [("cp-1", true), ("cp-2", true), ("cp-3", true)] {
        create_machine(
            &env,
            &ns,
            TalosMachine::test(name).control_plane().approved(),
            applied,
        )
        .await;
    }

    let refused = delete(&machines, "cp-1").await.expect_err("no annotation");
    assert!(
        refused.contains("kubectl annotate talosmachine cp-1 ichor.maesh.dev/allow-delete=true"),
        "{refused}"
    );
    for name in ["cp-1", "cp-2", "cp-3"] {
        machines
            .patch(
                name,
                &PatchParams::default(),
                &Patch::Merge(
                    json!({"metadata": {"annotations": {annotations::ALLOW_DELETE: "true"}}}),
                ),
            )
            .await
            .expect("annotate");
    }
    delete(&machines, "cp-1")
        .await
        .expect("3 -> 2 keeps quorum");
    let first = machines
        .get("cp-1")
        .await
        .expect("still there: its finalizer holds it");
    assert!(first.metadata.deletion_timestamp.is_some());
    let refused = delete(&machines, "cp-2")
        .await
        .expect_err("the first removal is still under way");
    assert!(
        refused.contains("control planes 2 -> 1, below etcd quorum of 2 for 2 members"),
        "{refused}"
    );

    // Flipping a live control plane to rejected would make it vanish from the count.
    let err = machines
        .patch(
            "cp-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "rejected"}})),
        )
        .await
        .expect_err("locked once applied");
    assert!(err.to_string().contains("approvalState"), "{err}");

    // Safe deletes pass without the annotation.
    for (name, role, approval, applied) in [
        (
            "worker-1",
            MachineRole::Worker,
            ApprovalState::Approved,
            true,
        ),
        (
            "pending-1",
            MachineRole::ControlPlane,
            ApprovalState::Pending,
            false,
        ),
        (
            "rejected-1",
            MachineRole::ControlPlane,
            ApprovalState::Rejected,
            false,
        ),
    ] {
        create_machine(
            &env,
            &ns,
            TalosMachine::test(name).role(role).approval(approval),
            applied,
        )
        .await;
        delete(&machines, name)
            .await
            .unwrap_or_else(|e| panic!("{name} may go: {e}"));
    }

    let clusters = api(&env, &ns, "TalosCluster");
    let refused = delete(&clusters, "lab").await.expect_err("no annotation");
    assert!(
        refused.contains("ichor.maesh.dev/allow-delete=true"),
        "{refused}"
    );

    // The apiserver calls the webhook for a machine update only when it changes the approval
    // or the role (the configuration's match condition, ADR 0063): with the webhook down, a
    // label patch on an applied control plane still goes through, and a pending machine's
    // role or approval change fails closed.
    running.stop().await;
    machines
        .patch(
            "cp-3",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"example.com/rack": "r1"}}})),
        )
        .await
        .expect("a label patch never waits on the webhook");
    create_machine(&env, &ns, TalosMachine::test("pending-2").worker(), false).await;
    for change in [
        json!({"spec": {"role": "controlplane"}}),
        json!({"spec": {"approvalState": "approved"}}),
    ] {
        let err = machines
            .patch("pending-2", &PatchParams::default(), &Patch::Merge(&change))
            .await
            .expect_err("the change reaches the webhook, which is down");
        assert!(
            err.to_string().contains("failed calling webhook"),
            "{change}: {err}"
        );
    }
}

#[tokio::test]
async fn parallel_deletes_admit_at_most_one_and_the_last_control_plane_stays() {
    let (env, ns, running) = setup().await;
    three_control_planes(&env, &ns).await;
    let machines = api(&env, &ns, "TalosMachine");
    let results = futures_join(&machines).await;
    let admitted = results.iter().filter(|r| r.is_ok()).count();
    assert_eq!(
        admitted, 1,
        "exactly one of three simultaneous deletes passes: {results:?}"
    );
    for refused in results.iter().filter_map(|r| r.as_ref().err()) {
        assert!(refused.contains("2 -> 1"), "{refused}");
    }

    let last = env.namespace("last").await.expect("namespace");
    create_cluster(&env, &last, 1).await;
    create_machine(
        &env,
        &last,
        TalosMachine::test("cp-1")
            .control_plane()
            .approved()
            .allow_delete(),
        true,
    )
    .await;
    let refused = delete(&api(&env, &last, "TalosMachine"), "cp-1")
        .await
        .expect_err("the last control plane");
    assert!(
        refused.contains("delete the TalosCluster instead"),
        "{refused}"
    );

    // An orphan, whose TalosCluster is gone, can be deleted: there is no cluster to delete
    // instead.
    let orphans = env.namespace("orphan").await.expect("namespace");
    create_machine(
        &env,
        &orphans,
        TalosMachine::test("cp-1").control_plane().approved(),
        true,
    )
    .await;
    delete(&api(&env, &orphans, "TalosMachine"), "cp-1")
        .await
        .expect("an orphaned control plane may be deleted");
    running.stop().await;
}

/// Deletes cp-1, cp-2 and cp-3 at the same moment.
async fn futures_join(machines: &Api<DynamicObject>) -> Vec<Result<(), String>> {
    let (a, b, c) = tokio::join!(
        delete(machines, "cp-1"),
        delete(machines, "cp-2"),
        delete(machines, "cp-3")
    );
    vec![a, b, c]
}

/// Creates `operation`; the refusal's reason and message, if refused.
async fn create_operation(
    operations: &Api<DynamicObject>,
    operation: OperationBuilder,
) -> Result<(), (String, String)> {
    let object: DynamicObject = serde_json::from_value(operation.json()).expect("operation");
    match operations.create(&PostParams::default(), &object).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err((status.reason, status.message)),
        Err(other) => Err((String::new(), other.to_string())),
    }
}

#[tokio::test]
async fn resets_and_reboots_that_would_break_etcd_are_refused_at_the_door() {
    let (env, ns, running) = setup().await;
    create_cluster(&env, &ns, 3).await;
    for i in 1..=5 {
        let pool = if i <= 3 { "a" } else { "b" };
        create_machine(
            &env,
            &ns,
            TalosMachine::test(&format!("cp-{i}"))
                .control_plane()
                .approved()
                .label("pool", pool),
            true,
        )
        .await;
    }
    let operations = api(&env, &ns, "TalosOperation");

    // Every control plane, one after another: the fourth would take etcd 2 -> 1.
    let every = TalosOperation::test("wipe-every", OperationAction::Reset)
        .cluster("lab")
        .all()
        .allow_delete();
    let (reason, message) = create_operation(&operations, every)
        .await
        .expect_err("a reset of all five control planes");
    assert_eq!(reason, reasons::QUORUM_AT_RISK, "{message}");
    assert!(message.contains("cp-4"), "{message}");

    // A control plane's reset needs the annotation on the operation.
    let unannotated = TalosOperation::test("wipe-one", OperationAction::Reset)
        .cluster("lab")
        .machine("cp-1");
    let (reason, message) = create_operation(&operations, unannotated)
        .await
        .expect_err("no annotation");
    assert_eq!(reason, reasons::ALLOW_DELETE_REQUIRED, "{message}");
    assert!(message.contains("talosoperation wipe-one"), "{message}");

    // Three of five, annotated: each step keeps quorum (the declared count is the manager's).
    let three = TalosOperation::test("wipe-three", OperationAction::Reset)
        .cluster("lab")
        .selector(LabelSelector {
            match_labels: Some([("pool".to_owned(), "a".to_owned())].into()),
            match_expressions: None,
        })
        .allow_delete();
    create_operation(&operations, three)
        .await
        .expect("5 -> 4 -> 3 -> 2 keeps quorum at each step");

    // cp-5 observed unhealthy: no healthy control plane is rebooted meanwhile.
    api(&env, &ns, "TalosMachine")
        .patch_status(
            "cp-5",
            &PatchParams::default(),
            &Patch::Merge(json!({"status": {"etcd": {
                "voter": true, "healthy": false, "observedAt": Timestamp::now().to_string()
            }}})),
        )
        .await
        .expect("status");
    let reboot = TalosOperation::test("reboot-cp-1", OperationAction::Reboot)
        .cluster("lab")
        .machine("cp-1");
    let (reason, message) = create_operation(&operations, reboot)
        .await
        .expect_err("cp-5 is unhealthy");
    assert_eq!(reason, reasons::ETCD_UNHEALTHY, "{message}");
    assert!(message.contains("cp-5"), "{message}");
    let heal = TalosOperation::test("reboot-cp-5", OperationAction::Reboot)
        .cluster("lab")
        .machine("cp-5");
    create_operation(&operations, heal)
        .await
        .expect("rebooting the unhealthy one itself keeps a healthy quorum");
    running.stop().await;
}

/// The removal reservations on the TalosCluster `lab`, as stored.
async fn reservations_on_lab(env: &TestEnv, ns: &str) -> Vec<ichor_api::reservation::Reservation> {
    let cluster: TalosCluster = Api::namespaced(env.client(), ns)
        .get("lab")
        .await
        .expect("the cluster");
    ichor_api::reservation::reservations(&cluster)
}

/// The webhook's serving CA, from its Secret.
async fn serving_ca(env: &TestEnv, ns: &str) -> String {
    let secret = Api::<Secret>::namespaced(env.client(), ns)
        .get(CERT_SECRET)
        .await
        .expect("the webhook's CA Secret");
    String::from_utf8(secret.data.expect("data")[CA_CERT_KEY].0.clone()).expect("PEM")
}

/// A DELETE review of the stored TalosMachine `name`, exactly as the apiserver would send it.
async fn delete_review(env: &TestEnv, ns: &str, name: &str) -> serde_json::Value {
    let live = api(env, ns, "TalosMachine")
        .get(name)
        .await
        .expect("the machine");
    machine_review(
        "forged-1",
        "DELETE",
        name,
        ns,
        Some(serde_json::to_value(&live).expect("json")),
    )
}

#[tokio::test]
async fn a_review_posted_without_the_apiservers_certificate_reserves_nothing() {
    let (env, ns, running) = setup().await;
    three_control_planes(&env, &ns).await;
    let port = running.addr().port();
    let ca = serving_ca(&env, &ns).await;
    // The strongest forgery: the live object itself, as the apiserver would send it.
    let review = delete_review(&env, &ns, "cp-1").await.to_string();

    let answer = post_review(port, &ca, None, &review)
        .await
        .expect("an answer to a caller without a certificate");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["status"]["reason"],
        reasons::CLIENT_CERTIFICATE_REQUIRED,
        "{answer}"
    );
    assert_eq!(answer["response"]["uid"], "forged-1");

    let stranger_ca = ichor_testenv::pki::new_ca_named("stranger").expect("a CA");
    let stranger =
        ichor_testenv::pki::client_cert(&stranger_ca, "kube-apiserver-webhook-client", None)
            .expect("a certificate of another CA");
    let refused = post_review(port, &ca, Some(&stranger), &review).await;
    assert!(
        refused.is_err(),
        "a certificate of another CA ends the handshake: {refused:?}"
    );
    assert!(
        reservations_on_lab(&env, &ns).await.is_empty(),
        "nothing reserved for a caller that is not the apiserver"
    );

    // The same review with the apiserver's own certificate is decided, and reserved: the
    // refusals above are the certificate's doing.
    let apiserver = env
        .connection()
        .webhook_client()
        .expect("the apiserver's certificate");
    let answer = post_review(port, &ca, Some(&apiserver), &review)
        .await
        .expect("an answer to the apiserver");
    assert_eq!(answer["response"]["allowed"], true, "{answer}");
    let reserved: Vec<String> = reservations_on_lab(&env, &ns)
        .await
        .into_iter()
        .map(|r| r.machine)
        .collect();
    assert_eq!(reserved, ["cp-1"]);
    running.stop().await;
}

#[tokio::test]
async fn a_review_of_another_uid_or_an_older_version_reserves_nothing() {
    let (env, ns, running) = setup().await;
    three_control_planes(&env, &ns).await;
    let port = running.addr().port();
    let ca = serving_ca(&env, &ns).await;
    let apiserver = env
        .connection()
        .webhook_client()
        .expect("the apiserver's certificate");
    let machines = api(&env, &ns, "TalosMachine");

    let mut other_uid = delete_review(&env, &ns, "cp-1").await;
    other_uid["request"]["oldObject"]["metadata"]["uid"] =
        json!("0badc0de-0000-0000-0000-000000000000");
    let stale = delete_review(&env, &ns, "cp-2").await;
    // cp-2 changes after the review was taken: the review is of an older version.
    machines
        .patch(
            "cp-2",
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"touched": "yes"}}})),
        )
        .await
        .expect("label cp-2");
    let mut missing = delete_review(&env, &ns, "cp-3").await;
    missing["request"]["name"] = json!("cp-9");
    missing["request"]["oldObject"]["metadata"]["name"] = json!("cp-9");

    for review in [other_uid, stale, missing] {
        let answer = post_review(port, &ca, Some(&apiserver), &review.to_string())
            .await
            .expect("an answer");
        assert_eq!(answer["response"]["allowed"], false, "{answer}");
        assert_eq!(
            answer["response"]["status"]["reason"],
            reasons::STALE_REVIEW,
            "{answer}"
        );
    }
    assert!(
        reservations_on_lab(&env, &ns).await.is_empty(),
        "nothing reserved for a review of anything but the live machine"
    );

    // A delete through the apiserver, whose review is of the live machine, still passes.
    delete(&machines, "cp-2")
        .await
        .expect("a real delete is admitted");
    running.stop().await;
}
