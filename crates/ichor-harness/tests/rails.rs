//! The safety rails against a real apiserver: a context missing from the kubeconfig is refused
//! before any call (by `up` and `down` alike), outer-cluster deletes must name one object in
//! `ichor-e2e`, a Talos call needs a node that is not protected, `up --target cluster` on a
//! control plane without KubeVirt stops clearly and leaves nothing, `up` cleans up on
//! SIGTERM, and a child process's environment stays small even when this process carries a
//! huge variable.

use std::collections::BTreeMap;

use ichor_harness::cluster_target::{self, TalosPods};
use ichor_harness::rails::{self, E2E_NAMESPACE, Outer, Pinned, Protected, RailError};
use ichor_testenv::TestEnv;
use ichor_testenv::nets::RAILS;
use k8s_openapi::api::core::v1::{ConfigMap, Namespace, Node, Pod, Secret};
use kube::api::{Api, ListParams, ObjectMeta, PostParams};

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

/// The `ichor-harness` binary with a cleared environment plus `env` (and what the sim target
/// needs to find its binaries).
fn harness(args: &[&str], env: &[(&str, &str)]) -> std::process::Command {
    let mut command = std::process::Command::new(env!("CARGO_BIN_EXE_ichor-harness"));
    command.env_clear().args(args);
    for key in ["PATH", "HOME", "KUBEBUILDER_ASSETS", "ICHOR_CACHE_DIR"] {
        if let Some(value) = std::env::var_os(key) {
            command.env(key, value);
        }
    }
    command.envs(env.iter().copied());
    command
}

const CLUSTER_UP: &[&str] = &[
    "up",
    "--target",
    "cluster",
    "--iso-schematic",
    "iso-with-console",
    "--installer-schematic",
    "plain",
    "--binaries",
    "/nonexistent",
];

#[tokio::test]
async fn up_and_down_refuse_without_a_pinned_existing_context() {
    let env = TestEnv::shared().await.expect("control plane");
    let file = kubeconfig_file(&env);
    let path = file.path().to_string_lossy().into_owned();
    let down: &[&str] = &[
        "down",
        "--target",
        "cluster",
        "--iso-schematic",
        "a",
        "--installer-schematic",
        "b",
    ];
    for args in [CLUSTER_UP, down] {
        let output = harness(args, &[]).output().expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(stderr.contains("KUBECONFIG is not set"), "{stderr}");

        let output = harness(args, &[(rails::KUBECONFIG_ENV, &path)])
            .output()
            .expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("ICHOR_E2E_KUBE_CONTEXT is not set"),
            "no fallback to the current-context: {stderr}"
        );

        let output = harness(
            args,
            &[
                (rails::KUBECONFIG_ENV, &path),
                (rails::CONTEXT_ENV, "somebody-elses-cluster"),
            ],
        )
        .output()
        .expect("run");
        assert!(!output.status.success());
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(
            stderr.contains("context \"somebody-elses-cluster\" is not in the kubeconfig"),
            "{stderr}"
        );
    }
}

#[tokio::test]
async fn up_on_a_control_plane_without_kubevirt_stops_clearly_and_leaves_nothing() {
    let env = TestEnv::shared().await.expect("control plane");
    let file = kubeconfig_file(&env);
    let path = file.path().to_string_lossy().into_owned();
    let _ = Api::<Namespace>::all(env.client())
        .create(
            &PostParams::default(),
            &Namespace {
                metadata: ObjectMeta {
                    name: Some(E2E_NAMESPACE.into()),
                    ..Default::default()
                },
                ..Default::default()
            },
        )
        .await;
    let output = harness(
        CLUSTER_UP,
        &[
            (rails::KUBECONFIG_ENV, &path),
            (rails::CONTEXT_ENV, "ichor-testenv"),
        ],
    )
    .output()
    .expect("run");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("does not serve kubevirt.io/v1")
            && stderr.contains("needs KubeVirt (VirtualMachine) installed; nothing was created"),
        "{stderr}"
    );
    // Nothing of a run is left in ichor-e2e.
    let selector = ListParams::default().labels("app.kubernetes.io/part-of=ichor-e2e");
    let client = env.client();
    assert!(
        Api::<Pod>::namespaced(client.clone(), E2E_NAMESPACE)
            .list(&selector)
            .await
            .expect("pods")
            .items
            .is_empty()
    );
    assert!(
        Api::<Secret>::namespaced(client.clone(), E2E_NAMESPACE)
            .list(&selector)
            .await
            .expect("secrets")
            .items
            .is_empty()
    );
}

#[tokio::test]
async fn talos_calls_need_a_node_and_never_reach_a_protected_address() {
    let env = TestEnv::shared().await.expect("control plane");
    let file = kubeconfig_file(&env);
    let pinned = Pinned::new(&file.path().to_string_lossy(), "ichor-testenv").expect("pinned");
    let outer = Outer::connect(&pinned).await.expect("outer");
    // An outer-cluster Node: its address becomes protected without being listed.
    let nodes: Api<Node> = Api::all(env.client());
    let node: Node = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": "rails-outer-node"},
        "status": {"addresses": [{"type": "InternalIP", "address": "10.250.0.7"}]},
    }))
    .expect("node");
    let _ = nodes.create(&PostParams::default(), &node).await;
    let given = Protected::parse("10.250.0.8").expect("list");
    let protected = cluster_target::outer_protected(&outer, &given)
        .await
        .expect("protected");
    let pods = TalosPods::new(outer, protected, "talosctl:never-pulled");

    let refused = pods
        .run(None, &["version"], true)
        .await
        .expect_err("no node");
    assert!(
        refused.to_string().contains("explicit target node"),
        "{refused}"
    );
    for address in ["10.250.0.7", "10.250.0.8", "10.250.0.7:50000"] {
        let refused = pods
            .run(Some(address), &["reset"], false)
            .await
            .expect_err("protected");
        assert!(refused.to_string().contains("is protected"), "{refused}");
    }
    // Refused before any call: no talosctl pod was ever created.
    assert!(
        Api::<Pod>::namespaced(env.client(), E2E_NAMESPACE)
            .get_opt(cluster_target::TALOSCTL_POD)
            .await
            .expect("get")
            .is_none()
    );
    let _ = nodes.delete("rails-outer-node", &Default::default()).await;
}

#[tokio::test]
async fn up_cleans_up_on_sigterm() {
    let out = tempfile::tempdir().expect("folder");
    let mut child = harness(
        &[
            "up",
            "--target",
            "sim",
            "--net",
            &RAILS.net(0).to_string(),
            "--out",
            &out.path().to_string_lossy(),
        ],
        &[],
    )
    .stdout(std::process::Stdio::piped())
    .stderr(std::process::Stdio::piped())
    .spawn()
    .expect("start");
    let stdout = child.stdout.take().expect("stdout");
    let (lines_tx, lines_rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        use std::io::BufRead as _;
        for line in std::io::BufReader::new(stdout)
            .lines()
            .map_while(Result::ok)
        {
            let _ = lines_tx.send(line);
        }
    });
    let ready = lines_rx
        .recv_timeout(std::time::Duration::from_secs(180))
        .expect("the sim target comes up");
    assert!(ready.starts_with("ready:"), "{ready}");
    let kubeconfig = std::fs::read_to_string(out.path().join("kubeconfig")).expect("kubeconfig");
    let config = kube::Config::from_custom_kubeconfig(
        kube::config::Kubeconfig::from_yaml(&kubeconfig).expect("yaml"),
        &Default::default(),
    )
    .await
    .expect("config");
    let client = kube::Client::try_from(config).expect("client");
    Api::<Namespace>::all(client.clone())
        .list(&ListParams::default())
        .await
        .expect("the control plane answers while up");

    let status = std::process::Command::new("kill")
        .args(["-TERM", &child.id().to_string()])
        .status()
        .expect("kill");
    assert!(status.success());
    let exited = std::thread::spawn(move || child.wait_with_output());
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(90);
    while !exited.is_finished() {
        assert!(
            std::time::Instant::now() < deadline,
            "no exit within 90 s of SIGTERM"
        );
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    let output = exited.join().expect("join").expect("wait");
    let rest: Vec<String> = lines_rx.try_iter().collect();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        rest.iter().any(|l| l == "cleaned up after SIGTERM"),
        "{rest:?}"
    );
    // The control plane it ran is gone.
    let gone = tokio::time::timeout(
        std::time::Duration::from_secs(10),
        Api::<Namespace>::all(client).list(&ListParams::default()),
    )
    .await;
    assert!(
        !matches!(gone, Ok(Ok(_))),
        "the apiserver still answers after cleanup"
    );
}
