//! The safety rails against a real apiserver: a context missing from the kubeconfig is refused
//! before any call, outer-cluster deletes must name one object in `ichor-e2e`, and a child
//! process's environment stays small even when this process carries a huge variable.

use std::collections::BTreeMap;

use ichor_harness::rails::{self, E2E_NAMESPACE, Outer, Pinned, RailError};
use ichor_testenv::TestEnv;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace};
use kube::api::{Api, ObjectMeta, PostParams};

fn kubeconfig_file(env: &TestEnv) -> tempfile::NamedTempFile {
    let file = tempfile::NamedTempFile::new().expect("temporary file");
    std::fs::write(file.path(), env.connection().kubeconfig()).expect("write kubeconfig");
    file
}

#[tokio::test]
async fn an_unknown_context_is_refused_before_any_call() {
    let env = TestEnv::shared().await.expect("control plane");
    let file = kubeconfig_file(&env);
    let path = file.path().to_string_lossy().into_owned();
    match Pinned::new(&path, "somebody-elses-cluster") {
        Err(RailError::UnknownContext { context, known, .. }) => {
            assert_eq!(context, "somebody-elses-cluster");
            assert!(known.contains("ichor-testenv"), "{known}");
        }
        other => panic!("expected a refusal, got {other:?}"),
    }
    // The same rail reads its variables: unset means refused, never a default.
    assert_eq!(
        Pinned::from_env(|k| (k == rails::KUBECONFIG_ENV).then(|| path.clone())).err(),
        Some(RailError::Unset(rails::CONTEXT_ENV))
    );
}

#[tokio::test]
async fn outer_deletes_name_one_object_in_the_e2e_namespace() {
    let env = TestEnv::shared().await.expect("control plane");
    let file = kubeconfig_file(&env);
    let pinned = Pinned::new(&file.path().to_string_lossy(), "ichor-testenv").expect("pinned");
    let outer = Outer::connect(&pinned).await.expect("outer");
    let admin = env.client();
    let namespaces: Api<Namespace> = Api::all(admin.clone());
    for name in [E2E_NAMESPACE, "rails-other"] {
        let _ = namespaces
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
            .await;
    }
    let config_map = |name: &str, namespace: &str| ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(namespace.into()),
            ..Default::default()
        },
        data: Some(BTreeMap::from([("k".into(), "v".into())])),
        ..Default::default()
    };
    let ours: Api<ConfigMap> = outer.api();
    ours.create(
        &PostParams::default(),
        &config_map("rails-cm", E2E_NAMESPACE),
    )
    .await
    .expect("create in ichor-e2e");
    let theirs: Api<ConfigMap> = Api::namespaced(admin.clone(), "rails-other");
    theirs
        .create(
            &PostParams::default(),
            &config_map("rails-cm", "rails-other"),
        )
        .await
        .expect("create elsewhere");

    let refused = outer.delete::<ConfigMap>("rails-other", "rails-cm").await;
    assert!(refused.is_err(), "a delete outside ichor-e2e is refused");
    assert!(
        theirs.get_opt("rails-cm").await.expect("get").is_some(),
        "and nothing was deleted"
    );
    let refused = outer.delete::<ConfigMap>(E2E_NAMESPACE, "").await;
    assert!(refused.is_err(), "a delete without a name is refused");
    assert!(ours.get_opt("rails-cm").await.expect("get").is_some());

    outer
        .delete::<ConfigMap>(E2E_NAMESPACE, "rails-cm")
        .await
        .expect("a named delete in ichor-e2e passes");
    assert!(ours.get_opt("rails-cm").await.expect("get").is_none());
}

/// Run as a child of [`a_child_environment_stays_small`] (with the probe variable set): prints
/// the size of the environment a rails command's child sees.
#[test]
fn child_environment_probe() {
    if std::env::var_os("ICHOR_RAILS_PROBE").is_none() {
        return;
    }
    let output = rails::command("env")
        .expect("the environment is small enough")
        .output()
        .expect("run env");
    println!("ENV_BYTES={}", output.stdout.len());
}

#[test]
fn a_child_environment_stays_small() {
    // 200 KiB of environment in this process's parent side. Linux refuses one string over
    // 128 KiB in an exec (MAX_ARG_STRLEN), so it is carried by two 100 KiB variables.
    let half = "x".repeat(100 * 1024);
    let output = std::process::Command::new(std::env::current_exe().expect("test binary"))
        .args(["--exact", "child_environment_probe", "--nocapture"])
        .env("ICHOR_RAILS_PROBE", "1")
        .env("ICHOR_HUGE_VARIABLE_1", &half)
        .env("ICHOR_HUGE_VARIABLE_2", &half)
        .output()
        .expect("run the probe");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let bytes: usize = stdout
        .lines()
        .find_map(|l| l.strip_prefix("ENV_BYTES="))
        .and_then(|n| n.trim().parse().ok())
        .unwrap_or_else(|| panic!("the probe did not report: {stdout}"));
    assert!(
        bytes < rails::CHILD_ENV_LIMIT,
        "the child saw {bytes} bytes of environment"
    );
}
