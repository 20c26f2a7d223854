//! The plugin binary against the sim e2e target: a real apiserver and etcd, simulated Talos
//! nodes, and the real `ichor-manager` and `ichor-webhook` binaries. Each test runs
//! `kubectl-ichor` as a person would, with a kubeconfig file, an explicit context and `-n`.
//! Build the manager and webhook first: `cargo build -p ichor-manager -p ichor-webhook --bins`.

use std::os::unix::fs::PermissionsExt as _;
use std::path::PathBuf;
use std::time::Duration;

use ichor_api::machine::ApprovalState;
use ichor_api::names::{labels, secrets as secret_names};
use ichor_api::{TalosCluster, TalosMachine};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_render::SecretsBundle;
use ichor_testenv::nets::KUBECTL_SIM;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::{Value, json};

/// The plugin as a person runs it against one target.
struct Plugin {
    kubeconfig: PathBuf,
    context: String,
    namespace: String,
    /// The administrator's client: what the secret scan reads the Secrets with.
    admin: kube::Client,
}

/// What one run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl Plugin {
    fn new(target: &SimTarget) -> Self {
        let kubeconfig = target.dir().join("plugin.kubeconfig");
        std::fs::write(&kubeconfig, target.kubeconfig()).expect("write the kubeconfig");
        Self {
            kubeconfig,
            context: target.context().to_owned(),
            namespace: target.namespace().to_owned(),
            admin: target.client(),
        }
    }

    async fn run(&self, args: &[&str]) -> Run {
        let output = tokio::process::Command::new(env!("CARGO_BIN_EXE_kubectl-ichor"))
            .args(args)
            .args(["--context", &self.context, "-n", &self.namespace])
            .env("KUBECONFIG", &self.kubeconfig)
            .output()
            .await
            .expect("run kubectl-ichor");
        let run = Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        };
        // No secret value of the run in what the plugin printed, whatever the command.
        ichor_harness::leaks::check_text(
            &self.admin,
            &format!("the output of kubectl ichor {args:?}"),
            &format!("{}\n{}", run.stdout, run.stderr),
        )
        .await
        .expect("the plugin printed no secret value");
        run
    }

    /// Runs and expects success.
    async fn ok(&self, args: &[&str]) -> String {
        let run = self.run(args).await;
        assert_eq!(run.code, 0, "kubectl ichor {args:?} failed: {run:?}");
        run.stdout
    }
}

fn machines(target: &SimTarget) -> Api<TalosMachine> {
    Api::namespaced(target.client(), target.namespace())
}

/// Every secret value of the cluster's bundle, as a config could carry it.
async fn bundle_secrets(target: &SimTarget, cluster: &str) -> Vec<String> {
    let found = Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .get(cluster)
        .await
        .expect("cluster");
    let name = found
        .status
        .and_then(|s| s.core.secrets_secret)
        .expect("status.secretsSecret");
    let secret = Api::<Secret>::namespaced(target.client(), target.namespace())
        .get(&name)
        .await
        .expect("bundle Secret");
    let data = secret.data.expect("data");
    let text = String::from_utf8(data[secret_names::BUNDLE_KEY].0.clone()).expect("utf-8");
    let bundle = SecretsBundle::from_yaml(&text).expect("bundle");
    kubectl_ichor::redact::bundle_secrets(&bundle)
}

fn assert_no_secret(text: &str, secrets: &[String], what: &str) {
    assert!(
        !kubectl_ichor::redact::leaked(text, secrets),
        "{what} shows a secret of the bundle"
    );
}

/// The applied-config Secret of `machine`: labelled with the machine, owned by it.
async fn applied_config(target: &SimTarget, machine: &TalosMachine) -> String {
    let name = format!(
        "{}{}",
        machine.name_any(),
        secret_names::APPLIED_CONFIG_SUFFIX
    );
    let secret = Api::<Secret>::namespaced(target.client(), target.namespace())
        .get(&name)
        .await
        .expect("the applied-config Secret");
    assert_eq!(
        secret.labels().get(labels::MACHINE),
        Some(&machine.name_any()),
        "labelled with its machine"
    );
    let owners = secret.metadata.owner_references.clone().unwrap_or_default();
    assert!(
        owners
            .iter()
            .any(|o| o.kind == "TalosMachine" && Some(&o.uid) == machine.uid().as_ref()),
        "owned by its machine: {owners:?}"
    );
    let data = secret.data.expect("data");
    String::from_utf8(data[secret_names::APPLIED_CONFIG_KEY].0.clone()).expect("utf-8")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_person_takes_pending_machines_to_a_ready_cluster_with_the_plugin() {
    let target = SimTarget::up(SimOptions::new(3, KUBECTL_SIM.net(0), "v1.14.1"))
        .await
        .expect("sim target");
    let plugin = Plugin::new(&target);
    let (shape, _) = specs::discovered_cluster(&target, "v1.14.1", 1, 3)
        .await
        .expect("cluster discovered");
    let endpoints = target.node_endpoints();
    let mut found = Vec::new();
    for address in &endpoints {
        found.push(specs::machine_at(&target, address).await.expect("machine"));
    }
    let names: Vec<String> = found.iter().map(|m| m.name_any()).collect();

    // pending: every discovered machine, with its address and pinned fingerprint.
    let listed = plugin.ok(&["pending"]).await;
    assert!(listed.starts_with("NAME "), "{listed}");
    for (machine, address) in found.iter().zip(&endpoints) {
        let line = listed
            .lines()
            .find(|l| l.starts_with(&format!("{} ", machine.name_any())))
            .unwrap_or_else(|| panic!("{} missing from\n{listed}", machine.name_any()));
        let pin = machine
            .spec
            .fingerprint
            .clone()
            .expect("a pinned fingerprint");
        assert!(line.contains(&pin), "{line}");
        assert!(line.contains(address.as_str()), "{line}");
        assert!(line.contains(shape.name.as_str()), "{line}");
        let uuid = machine
            .status
            .as_ref()
            .and_then(|s| s.inventory.hardware.as_ref())
            .map(|h| h.uuid.clone())
            .expect("hardware");
        assert!(line.contains(&uuid), "{line}");
    }

    // approve without a role: refused before anything is sent.
    let refused = plugin.run(&["approve", &names[0]]).await;
    assert_eq!(refused.code, 2, "{refused:?}");
    assert!(
        refused.stderr.contains("--role controlplane"),
        "{refused:?}"
    );
    let unchanged = machines(&target).get(&names[0]).await.expect("machine");
    assert_eq!(unchanged.spec.approval_state, ApprovalState::Pending);

    // approve with roles, reject the third.
    let out = plugin
        .ok(&["approve", &names[0], "--role", "controlplane"])
        .await;
    assert!(
        out.contains("spec.approvalState: pending -> approved")
            && out.contains("spec.role: (unset) -> controlplane"),
        "{out}"
    );
    let out = plugin.ok(&["approve", &names[1], "--role", "worker"]).await;
    assert!(out.contains("spec.role: (unset) -> worker"), "{out}");
    let out = plugin.ok(&["reject", &names[2]]).await;
    assert!(
        out.contains("spec.approvalState: pending -> rejected"),
        "{out}"
    );
    let now: Vec<TalosMachine> = {
        let mut v = Vec::new();
        for name in &names {
            v.push(machines(&target).get(name).await.expect("machine"));
        }
        v
    };
    assert_eq!(now[0].spec.approval_state, ApprovalState::Approved);
    assert_eq!(
        now[0].spec.role,
        Some(ichor_api::common::Role::ControlPlane)
    );
    assert_eq!(now[1].spec.approval_state, ApprovalState::Approved);
    assert_eq!(now[1].spec.role, Some(ichor_api::common::Role::Worker));
    assert_eq!(now[2].spec.approval_state, ApprovalState::Rejected);
    let listed = plugin.ok(&["pending"]).await;
    assert!(listed.starts_with("No pending TalosMachines"), "{listed}");

    if let Err(error) = specs::wait_ready(&target, &shape.name, Duration::from_secs(180)).await {
        panic!(
            "{error}; machines: {}; manager: {}",
            specs::summary(&target).await,
            target.manager_log_tail()
        );
    }

    // describe: the cluster and every machine, grouped.
    let tree = plugin.ok(&["describe", "cluster", &shape.name]).await;
    assert!(
        tree.starts_with(&format!("TalosCluster/{}   Ready=True", shape.name)),
        "{tree}"
    );
    for name in &names {
        assert!(
            tree.contains(&format!("TalosMachine/{name} ")),
            "{name}: {tree}"
        );
    }
    assert!(tree.contains("Control planes (1)"), "{tree}");
    assert!(tree.contains("Workers (1)"), "{tree}");
    assert!(tree.contains("Pending and unassigned (1)"), "{tree}");
    assert!(tree.contains("rejected: never touched"), "{tree}");
    assert!(tree.contains("lock: free"), "{tree}");

    // render: the config as the manager renders it, without a secret of the bundle; and no
    // difference from what was applied, which the manager kept.
    let secrets = bundle_secrets(&target, &shape.name).await;
    for name in &names[..2] {
        let config = plugin.ok(&["render", name]).await;
        assert!(
            config.starts_with(&format!("# TalosMachine {name} (")),
            "{config}"
        );
        assert!(config.contains("<redacted>"), "{config}");
        assert!(config.contains("kind: KubeClusterConfig"), "{config}");
        assert_no_secret(&config, &secrets, "render");
        let documents: Vec<Value> = serde_saphyr::from_multiple(&config).expect("YAML");
        assert!(documents.len() > 5);
        let diff = plugin.ok(&["render", name, "--diff"]).await;
        assert!(diff.starts_with("no difference"), "{diff}");
        let machine = machines(&target).get(name).await.expect("machine");
        let stored = applied_config(&target, &machine).await;
        assert_eq!(
            ichor_render::config_hash(&stored),
            machine
                .status
                .and_then(|s| s.applied.config_hash)
                .expect("applied")
        );
    }
    // The rejected machine: nothing applied; a preview needs a role.
    let preview = plugin.run(&["render", &names[2]]).await;
    assert_eq!(preview.code, 2, "{preview:?}");
    assert!(preview.stderr.contains("--role"), "{preview:?}");
    let diff = plugin
        .ok(&["render", &names[2], "--role", "worker", "--diff"])
        .await;
    assert!(diff.starts_with("nothing applied yet"), "{diff}");
    assert!(diff.contains("is never applied"), "{diff}");

    // The apiserver refuses a role change once applied: its message, verbatim.
    let locked = plugin
        .run(&["approve", &names[0], "--role", "worker"])
        .await;
    assert_eq!(locked.code, 1, "{locked:?}");
    assert!(
        locked.stderr.contains(&format!(
            "the apiserver refused the change to TalosMachine {}",
            names[0]
        )),
        "{locked:?}"
    );
    assert!(
        locked.stderr.contains("status.appliedConfigHash is set"),
        "{locked:?}"
    );

    // talosconfig: a private file with a context; never overwritten unless forced.
    let file = target.dir().join("talosconfig");
    let path = file.to_str().expect("a UTF-8 path");
    let out = plugin.ok(&["talosconfig", &shape.name, "-o", path]).await;
    assert!(out.contains(&format!("context {}", shape.name)), "{out}");
    let mode = std::fs::metadata(&file)
        .expect("written")
        .permissions()
        .mode()
        & 0o777;
    assert_eq!(mode, 0o600);
    let written = std::fs::read_to_string(&file).expect("read");
    let value: Value = serde_saphyr::from_str(&written).expect("YAML");
    assert_eq!(value["context"], json!(shape.name));
    assert!(value["contexts"][&shape.name]["crt"].is_string(), "{value}");
    let again = plugin.run(&["talosconfig", &shape.name, "-o", path]).await;
    assert_eq!(again.code, 1, "{again:?}");
    assert!(again.stderr.contains("already exists"), "{again:?}");
    plugin
        .ok(&["talosconfig", &shape.name, "-o", path, "--force"])
        .await;

    // Unknown objects: named, with what to do.
    let missing = plugin.run(&["describe", "cluster", "nope"]).await;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing
            .stderr
            .contains("TalosCluster nope not found in namespace"),
        "{missing:?}"
    );
    let missing = plugin.run(&["reject", "nope"]).await;
    assert_eq!(missing.code, 1, "{missing:?}");
    assert!(
        missing.stderr.contains("TalosMachine nope not found"),
        "{missing:?}"
    );
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn render_diff_shows_drift_until_the_manager_applies_it() {
    let mut target = SimTarget::up(SimOptions::new(1, KUBECTL_SIM.net(1), "v1.14.1"))
        .await
        .expect("sim target");
    let plugin = Plugin::new(&target);
    let (shape, found) = specs::discovered_cluster(&target, "v1.14.1", 1, 1)
        .await
        .expect("cluster discovered");
    let name = found[0].name_any();
    plugin
        .ok(&["approve", &name, "--role", "controlplane"])
        .await;
    if let Err(error) = specs::wait_ready(&target, &shape.name, Duration::from_secs(180)).await {
        panic!(
            "{error}; machines: {}; manager: {}",
            specs::summary(&target).await,
            target.manager_log_tail()
        );
    }
    let diff = plugin.ok(&["render", &name, "--diff"]).await;
    assert!(diff.starts_with("no difference"), "{diff}");

    // A change made while no manager runs: the diff shows it, redacted.
    target.kill_manager().await;
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            &shape.name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"configPatches": [{"name": "san", "machine": {"certSANs": ["drift.example.internal"]}}]}})),
        )
        .await
        .expect("a change");
    let diff = plugin.ok(&["render", &name, "--diff"]).await;
    assert!(diff.starts_with("--- applied sha256:"), "{diff}");
    assert!(diff.contains("\n+++ rendered now sha256:"), "{diff}");
    assert!(diff.contains("drift.example.internal"), "{diff}");
    assert!(
        diff.lines()
            .filter(|l| l.starts_with('+') && !l.starts_with("+++"))
            .any(|l| l.contains("drift.example.internal")),
        "{diff}"
    );
    assert_no_secret(
        &diff,
        &bundle_secrets(&target, &shape.name).await,
        "render --diff",
    );

    // The manager applies it live and keeps it: no difference any more.
    target.start_manager().await.expect("restart");
    try_eventually(
        "the drift applied and recorded",
        Duration::from_secs(90),
        || async {
            plugin
                .run(&["render", &name, "--diff"])
                .await
                .stdout
                .starts_with("no difference")
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}; manager: {}", target.manager_log_tail()));
    let machine = machines(&target).get(&name).await.expect("machine");
    let stored = applied_config(&target, &machine).await;
    assert!(stored.contains("drift.example.internal"));
    target.down().await;
}
