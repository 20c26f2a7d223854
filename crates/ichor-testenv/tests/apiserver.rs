//! The test control plane is a real kube-apiserver: core objects, CRD validation rules, RBAC and
//! admission webhooks behave as the API defines them.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Json;
use axum::extract::State;
use axum::routing::post;
use ichor_testenv::{ControlPlane, Error, TestEnv, pki};
use k8s_openapi::api::admissionregistration::v1::RuleWithOperations;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Secret};
use k8s_openapi::api::rbac::v1::{PolicyRule, Role, RoleBinding, RoleRef, Subject};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Api;
use kube::api::{DynamicObject, ObjectMeta, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::{Value, json};

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        ..Default::default()
    }
}

/// The status code and message of an API error, or a panic naming what succeeded.
fn api_error<T: std::fmt::Debug>(result: Result<T, kube::Error>) -> (u16, String) {
    match result {
        Err(kube::Error::Api(status)) => (status.code, status.message),
        other => panic!("expected an API error, got {other:?}"),
    }
}

#[tokio::test]
async fn creates_and_reads_namespace_secret_and_lease() {
    let env = TestEnv::shared().await.expect("control plane");
    let ns = env.namespace("core").await.expect("namespace");
    let client = env.client();

    let read_ns = Api::<Namespace>::all(client.clone())
        .get(&ns)
        .await
        .expect("read namespace");
    assert_eq!(read_ns.metadata.name.as_deref(), Some(ns.as_str()));

    let secrets = Api::<Secret>::namespaced(client.clone(), &ns);
    let secret = Secret {
        metadata: meta("bundle"),
        string_data: Some([("key".to_owned(), "value".to_owned())].into()),
        ..Default::default()
    };
    secrets
        .create(&PostParams::default(), &secret)
        .await
        .expect("create secret");
    let read = secrets.get("bundle").await.expect("read secret");
    let data = read.data.expect("secret data");
    assert_eq!(data["key"].0, b"value");

    let leases = Api::<Lease>::namespaced(client, &ns);
    let lease = Lease {
        metadata: meta("lock"),
        spec: Some(LeaseSpec {
            holder_identity: Some("removal/1234".into()),
            lease_duration_seconds: Some(15),
            ..Default::default()
        }),
    };
    leases
        .create(&PostParams::default(), &lease)
        .await
        .expect("create lease");
    let read = leases.get("lock").await.expect("read lease");
    assert_eq!(
        read.spec.and_then(|s| s.holder_identity).as_deref(),
        Some("removal/1234")
    );
}

fn widget_crd() -> CustomResourceDefinition {
    serde_json::from_value(json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.testenv.ichor.maesh.dev"},
        "spec": {
            "group": "testenv.ichor.maesh.dev",
            "scope": "Namespaced",
            "names": {"plural": "widgets", "singular": "widget", "kind": "Widget"},
            "versions": [{
                "name": "v1",
                "served": true,
                "storage": true,
                "schema": {"openAPIV3Schema": {
                    "type": "object",
                    "properties": {"spec": {
                        "type": "object",
                        "properties": {
                            "replicas": {"type": "integer"},
                            "maxReplicas": {"type": "integer"}
                        },
                        "x-kubernetes-validations": [{
                            "rule": "self.replicas <= self.maxReplicas",
                            "message": "replicas must not exceed maxReplicas"
                        }]
                    }}
                }}
            }]
        }
    }))
    .expect("valid CRD")
}

#[tokio::test]
async fn crd_validation_rule_refuses_a_violating_object_with_its_message() {
    let env = TestEnv::shared().await.expect("control plane");
    env.install_crds([widget_crd()]).await.expect("install CRD");
    let ns = env.namespace("cel").await.expect("namespace");
    let gvk = GroupVersionKind::gvk("testenv.ichor.maesh.dev", "v1", "Widget");
    let api: Api<DynamicObject> =
        Api::namespaced_with(env.client(), &ns, &ApiResource::from_gvk(&gvk));
    let widget = |name: &str, replicas: i64| -> DynamicObject {
        serde_json::from_value(json!({
            "apiVersion": "testenv.ichor.maesh.dev/v1",
            "kind": "Widget",
            "metadata": {"name": name},
            "spec": {"replicas": replicas, "maxReplicas": 3}
        }))
        .expect("valid object")
    };

    api.create(&PostParams::default(), &widget("fits", 2))
        .await
        .expect("an object within the rule is accepted");
    let (code, message) = api_error(
        api.create(&PostParams::default(), &widget("too-big", 5))
            .await,
    );
    assert_eq!(code, 422, "{message}");
    assert!(
        message.contains("replicas must not exceed maxReplicas"),
        "the rule's message reaches the caller: {message}"
    );
}

#[tokio::test]
async fn rbac_refuses_a_client_outside_system_masters_until_a_role_allows_it() {
    let env = TestEnv::shared().await.expect("control plane");
    let ns = env.namespace("rbac").await.expect("namespace");
    let alice = env
        .client_as("alice", Some("developers"))
        .await
        .expect("client");
    let secrets = Api::<Secret>::namespaced(alice.clone(), &ns);

    let (code, message) = api_error(secrets.list(&Default::default()).await);
    assert_eq!(code, 403, "{message}");
    assert!(message.contains("\"alice\""), "{message}");

    let admin = env.client();
    let role = Role {
        metadata: meta("secret-reader"),
        rules: Some(vec![PolicyRule {
            api_groups: Some(vec![String::new()]),
            resources: Some(vec!["secrets".into()]),
            verbs: vec!["list".into()],
            ..Default::default()
        }]),
    };
    Api::<Role>::namespaced(admin.clone(), &ns)
        .create(&PostParams::default(), &role)
        .await
        .expect("create role");
    let binding = RoleBinding {
        metadata: meta("alice-reads-secrets"),
        role_ref: RoleRef {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Role".into(),
            name: "secret-reader".into(),
        },
        subjects: Some(vec![Subject {
            kind: "Group".into(),
            name: "developers".into(),
            ..Default::default()
        }]),
    };
    Api::<RoleBinding>::namespaced(admin, &ns)
        .create(&PostParams::default(), &binding)
        .await
        .expect("create binding");
    // The authorizer learns of new bindings through its informers: eventually, not at once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(15);
    loop {
        match secrets.list(&Default::default()).await {
            Ok(_) => break,
            Err(e) if std::time::Instant::now() > deadline => {
                panic!("the group's role never allowed listing: {e}")
            }
            Err(_) => tokio::time::sleep(std::time::Duration::from_millis(200)).await,
        }
    }
}

#[tokio::test]
async fn missing_binaries_fail_with_how_to_build_them() {
    let empty = tempfile::tempdir().expect("temp dir");
    let err = ControlPlane::builder()
        .assets_dir(empty.path())
        .start()
        .await
        .expect_err("no binaries, no control plane");
    assert!(matches!(err, Error::MissingAssets { .. }), "{err:?}");
    let message = err.to_string();
    assert!(message.contains("cargo xtask envtest-assets"), "{message}");
    assert!(message.contains("kube-apiserver, etcd"), "{message}");
    // What a test's `expect` prints says what to do, too.
    assert!(
        format!("{err:?}").contains("cargo xtask envtest-assets"),
        "{err:?}"
    );
}

#[tokio::test]
async fn the_shared_control_plane_refuses_cluster_scoped_webhooks() {
    let env = TestEnv::shared().await.expect("control plane");
    let err = env
        .register_webhook("nope", "https://127.0.0.1:1/", "", vec![])
        .await
        .expect_err("shared control planes take no webhooks");
    assert!(matches!(err, Error::SharedAdmission), "{err:?}");
}

/// Denies ConfigMaps labelled `deny: "yes"`, counting the reviews it receives.
async fn review(State(calls): State<Arc<AtomicUsize>>, Json(review): Json<Value>) -> Json<Value> {
    calls.fetch_add(1, Ordering::SeqCst);
    let request = &review["request"];
    let denied = request["object"]["metadata"]["labels"]["deny"] == "yes";
    let mut response = json!({"uid": request["uid"], "allowed": !denied});
    if denied {
        response["status"] = json!({"code": 403, "message": "denied by the testenv webhook"});
    }
    Json(json!({
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "response": response
    }))
}

fn labelled_config_map(name: &str, deny: &str) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some([("deny".to_owned(), deny.to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    }
}

#[tokio::test]
async fn a_registered_webhook_is_called_over_tls() {
    let env = TestEnv::private().await.expect("private control plane");
    let ca = pki::new_ca().expect("ca");
    let serving = pki::loopback_server_cert(&ca, "testenv-webhook").expect("serving cert");
    let tls = axum_server::tls_rustls::RustlsConfig::from_pem(
        serving.cert_pem.into_bytes(),
        serving.key_pem.into_bytes(),
    )
    .await
    .expect("tls config");
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let calls = Arc::new(AtomicUsize::new(0));
    let app = axum::Router::new()
        .route("/validate", post(review))
        .with_state(calls.clone());
    let server = axum_server::from_tcp_rustls(listener, tls).expect("server");
    tokio::spawn(server.serve(app.into_make_service()));

    let rule: RuleWithOperations = serde_json::from_value(json!({
        "apiGroups": [""], "apiVersions": ["v1"], "resources": ["configmaps"],
        "operations": ["CREATE"], "scope": "Namespaced"
    }))
    .expect("rule");
    env.register_webhook(
        "testenv",
        &format!("https://127.0.0.1:{port}/validate"),
        &ca.cert_pem,
        vec![rule],
    )
    .await
    .expect("register webhook");

    let ns = env.namespace("webhook").await.expect("namespace");
    let config_maps = Api::<ConfigMap>::namespaced(env.client(), &ns);
    let message = deny_once_registered(&config_maps).await;
    assert!(
        message.contains("denied by the testenv webhook"),
        "{message}"
    );
    config_maps
        .create(
            &PostParams::default(),
            &labelled_config_map("allowed", "no"),
        )
        .await
        .expect("the webhook allows an unlabelled object");
    assert!(
        calls.load(Ordering::SeqCst) >= 2,
        "the apiserver called the webhook"
    );
}

/// The apiserver picks up a new webhook configuration asynchronously: retry until it applies.
async fn deny_once_registered(config_maps: &Api<ConfigMap>) -> String {
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut attempt = 0;
    loop {
        attempt += 1;
        let name = format!("denied-{attempt}");
        match config_maps
            .create(&PostParams::default(), &labelled_config_map(&name, "yes"))
            .await
        {
            Err(kube::Error::Api(status)) => return status.message,
            Err(other) => panic!("unexpected error: {other}"),
            Ok(_) if Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Ok(_) => panic!("the webhook never took effect"),
        }
    }
}

#[tokio::test]
async fn a_restarted_etcd_or_apiserver_keeps_the_objects_the_ports_and_the_kubeconfig() {
    let mut plane = ControlPlane::start().await.expect("control plane");
    let client = plane.connection().client().await.expect("client");
    let maps = Api::<ConfigMap>::namespaced(client.clone(), "default");
    let map = ConfigMap {
        metadata: meta("kept"),
        data: Some([("k".to_owned(), "v".to_owned())].into()),
        ..Default::default()
    };
    maps.create(&PostParams::default(), &map)
        .await
        .expect("create");
    let [etcd, apiserver] = plane.pids();

    plane.stop_etcd().expect("stop etcd");
    assert_eq!(plane.pids()[0], 0, "no etcd pid while stopped");
    plane.start_etcd().await.expect("start etcd");
    assert_ne!(plane.pids()[0], etcd, "a new etcd");
    let read = maps.get("kept").await.expect("read after the etcd restart");
    assert_eq!(read.data.expect("data")["k"], "v");

    plane.stop_apiserver().expect("stop the apiserver");
    assert!(
        maps.get("kept").await.is_err(),
        "nothing answers on the apiserver's port"
    );
    plane.start_apiserver().await.expect("start the apiserver");
    assert_ne!(plane.pids()[1], apiserver, "a new apiserver");
    // The same client (same port, same certificates) reads what was stored.
    let read = maps
        .get("kept")
        .await
        .expect("read after the apiserver restart");
    assert_eq!(read.data.expect("data")["k"], "v");
}
