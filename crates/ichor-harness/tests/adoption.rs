//! Adoption of a running Talos cluster on the sim target, with the real `talosctl` and the real
//! `ichor-manager`: a cluster brought up outside Ichor (`talosctl gen secrets`, `gen config`,
//! `apply-config`, `bootstrap`) is adopted with its bundle and node endpoints. No node receives
//! an apply or a reboot; the TalosCluster becomes Ready; its live configs, unlike what Ichor
//! renders, are held as drift; a reboot operation and a worker's removal then work on it. The
//! wrong bundle is refused before anything is recorded, showing both fingerprints. A TalosCluster
//! created anew for the running nodes without its bundle gets none generated, and a Secret of
//! the user's under the kubeconfig's name is left alone until freed (ADR 0053). Each adopted
//! machine holds the claim on its node's UUID, and the removed worker's is released; a namespace confined to other
//! address ranges adopts nothing until its policy allows the endpoints (ADR 0054).

use std::path::PathBuf;
use std::time::Duration;

use ichor_api::claim::TalosNamespacePolicySpec;
use ichor_api::names::{conditions, labels, reasons, secrets as keys};
use ichor_api::operation::{OperationAction, OperationPhase};
use ichor_api::{
    TalosCluster, TalosMachine, TalosMachineClaim, TalosNamespacePolicy, TalosOperation,
};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::nets::ADOPTION;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::ResourceExt as _;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use support::put_secret;
use tokio::process::Command;

mod support;

const VERSION: &str = "v1.14.1";
const WAIT: Duration = Duration::from_secs(120);

/// The real talosctl, run with a home of its own.
struct Talosctl {
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl Talosctl {
    fn new() -> Self {
        let binary = ichor_testenv::assets::oracles_dir().join("talosctl");
        assert!(
            binary.is_file(),
            "{} is missing: run `cargo xtask oracles` to build talosctl",
            binary.display()
        );
        Self {
            binary,
            dir: tempfile::tempdir().expect("a folder"),
        }
    }

    fn path(&self, name: &str) -> String {
        self.dir.path().join(name).to_string_lossy().into_owned()
    }

    /// Runs talosctl until it succeeds (Talos answers "not available yet" for a while after a
    /// boot, and a person runs the command again), within `limit`.
    async fn ok(&self, args: &[&str], limit: Duration) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let out = Command::new(&self.binary)
                .args(args)
                .env_clear()
                .env("HOME", self.dir.path())
                .env("TALOSCONFIG", self.path("talosconfig"))
                .output()
                .await
                .expect("run talosctl");
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).into_owned();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "talosctl {} failed: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr)
            );
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }
}

/// Brings the nodes up as one cluster with talosctl: the first a control plane, the others
/// workers. Returns the talosctl, whose folder holds `secrets.yaml`.
async fn brought_up_by_hand(target: &SimTarget) -> Talosctl {
    let talosctl = Talosctl::new();
    let ips = target.node_endpoints();
    let cp = ips[0].clone();
    let short = Duration::from_secs(10);
    talosctl
        .ok(
            &["gen", "secrets", "-o", &talosctl.path("secrets.yaml")],
            short,
        )
        .await;
    // gen config writes talosconfig beside the configs: the folder TALOSCONFIG points into.
    let out = talosctl.dir.path().to_string_lossy().into_owned();
    talosctl
        .ok(
            &[
                "gen",
                "config",
                "lab",
                &format!("https://{cp}:6443"),
                "--with-secrets",
                &talosctl.path("secrets.yaml"),
                "--install-disk",
                "/dev/vda",
                "--kubernetes-version",
                "1.36.3",
                "--output-dir",
                &out,
            ],
            short,
        )
        .await;
    for (i, ip) in ips.iter().enumerate() {
        let file = if i == 0 {
            "controlplane.yaml"
        } else {
            "worker.yaml"
        };
        talosctl
            .ok(
                &[
                    "apply-config",
                    "--insecure",
                    "-n",
                    ip,
                    "--file",
                    &format!("{out}/{file}"),
                ],
                short,
            )
            .await;
    }
    talosctl.ok(&["config", "endpoint", &cp], short).await;
    talosctl.ok(&["config", "node", &cp], short).await;
    talosctl.ok(&["bootstrap"], WAIT).await;
    let members = talosctl.ok(&["etcd", "members"], WAIT).await;
    assert!(members.lines().count() >= 2, "one member: {members}");
    talosctl
}

/// No TalosMachine is recorded: an adoption refused records none of its nodes.
async fn assert_nothing_recorded(machines: &Api<TalosMachine>) {
    let recorded = machines.list(&ListParams::default()).await.expect("list");
    assert!(recorded.items.is_empty(), "nothing recorded: {recorded:?}");
}

async fn adopted_condition(target: &SimTarget, name: &str, reason: &str) -> String {
    cluster_condition(target, name, conditions::ADOPTED, reason).await
}

/// The message of the TalosCluster `name`'s condition `type_` once its reason is `reason`.
async fn cluster_condition(target: &SimTarget, name: &str, type_: &str, reason: &str) -> String {
    let api = Api::<TalosCluster>::namespaced(target.client(), target.namespace());
    let found = try_eventually(&format!("{name}: {type_} {reason}"), WAIT, || async {
        api.get(name)
            .await
            .ok()?
            .status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == type_ && c.reason == reason)
            .map(|c| c.message)
    })
    .await;
    match found {
        Ok(message) => message,
        Err(e) => panic!(
            "{e}: {:?}\n{}",
            api.get(name).await.ok().and_then(|c| c.status),
            target.manager_log_tail()
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_cluster_is_adopted_untouched_and_then_managed() {
    let target = SimTarget::up(SimOptions::new(3, ADOPTION.net(0), VERSION))
        .await
        .expect("sim target");
    let talosctl = brought_up_by_hand(&target).await;
    let applies = |t: &SimTarget| -> Vec<usize> {
        t.nodes()
            .iter()
            .map(|n| n.calls("ApplyConfiguration"))
            .collect()
    };
    let before = applies(&target);
    let endpoints = target.node_endpoints();
    let bundle = std::fs::read(talosctl.path("secrets.yaml")).expect("secrets.yaml");
    put_secret(&target, "lab-bundle", &[(keys::BUNDLE_KEY, &bundle)]).await;

    // Created again without its status or its bundle Secret (GitOps, a restored management
    // cluster): its nodes run, so no new bundle is generated (ADR 0053) until it is restored.
    specs::create_cluster_with(
        &target,
        &Shape {
            name: "again".into(),
            control_planes: 1,
            ..Shape::new(VERSION, "flannel")
        },
        |spec| spec.discovery = None,
    )
    .await
    .expect("the re-created cluster");
    let message = cluster_condition(
        &target,
        "again",
        conditions::SECRETS_READY,
        reasons::SECRETS_BUNDLE_NOT_GENERATED,
    )
    .await;
    assert!(message.contains(&endpoints[0]), "the node named: {message}");
    let secrets = Api::<Secret>::namespaced(target.client(), target.namespace());
    assert!(
        secrets
            .get_opt("again-secrets")
            .await
            .expect("read")
            .is_none(),
        "no bundle generated"
    );
    put_secret(&target, "again-secrets", &[(keys::BUNDLE_KEY, &bundle)]).await;
    cluster_condition(
        &target,
        "again",
        conditions::SECRETS_READY,
        reasons::BUNDLE_VALID,
    )
    .await;
    // A Secret of the user's under the name Ichor publishes the kubeconfig under.
    put_secret(
        &target,
        "lab-kubeconfig",
        &[(keys::KUBECONFIG_KEY, b"mine")],
    )
    .await;

    // The wrong bundle: nothing is recorded, and both fingerprints are shown.
    let other = Talosctl::new();
    other
        .ok(&["gen", "secrets", "-o", &other.path("secrets.yaml")], WAIT)
        .await;
    let wrong = std::fs::read(other.path("secrets.yaml")).expect("secrets.yaml");
    put_secret(&target, "wrong-bundle", &[(keys::BUNDLE_KEY, &wrong)]).await;
    let shape = Shape {
        control_planes: 1,
        ..Shape::new(VERSION, "flannel")
    };
    let adopt = |bundle: &str| {
        let endpoints = endpoints.clone();
        let bundle = bundle.to_owned();
        move |spec: &mut ichor_api::TalosClusterSpec| {
            spec.secrets_ref = Some(ichor_api::common::LocalObjectReference { name: bundle });
            spec.adopt = Some(ichor_api::cluster::AdoptSpec { endpoints });
            spec.discovery = None;
        }
    };
    specs::create_cluster_with(
        &target,
        &Shape {
            name: "wrong".into(),
            ..shape.clone()
        },
        adopt("wrong-bundle"),
    )
    .await
    .expect("the wrongly bundled cluster");
    let message = adopted_condition(&target, "wrong", reasons::ADOPTION_BUNDLE_MISMATCH).await;
    assert!(
        message.contains("sha256:"),
        "the bundle's fingerprint: {message}"
    );
    assert!(
        message.contains("SPKI fingerprint"),
        "the node's: {message}"
    );
    let machines = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    assert_nothing_recorded(&machines).await;

    // The right bundle, from a namespace confined to other addresses: nothing is contacted or
    // recorded (ADR 0054).
    let policies = Api::<TalosNamespacePolicy>::all(target.client());
    let confined_to = |ranges: Vec<String>| {
        TalosNamespacePolicy::new(
            target.namespace(),
            TalosNamespacePolicySpec {
                address_ranges: ranges,
            },
        )
    };
    policies
        .create(
            &PostParams::default(),
            &confined_to(vec!["192.0.2.0/24".into()]),
        )
        .await
        .expect("the namespace's policy");
    specs::create_cluster_with(&target, &shape, adopt("lab-bundle"))
        .await
        .expect("the adopting cluster");
    let message = adopted_condition(&target, "lab", reasons::ADDRESS_NOT_ALLOWED).await;
    assert!(
        message.contains(&endpoints[0]),
        "the address named: {message}"
    );
    assert_nothing_recorded(&machines).await;

    // Allowed there: adopted, Ready, nothing applied. The policy's change reaches the cluster
    // at its next reconcile, which a change of the cluster brings at once.
    let own: Vec<String> = endpoints
        .iter()
        .map(|address| match address.parse::<std::net::IpAddr>() {
            Ok(std::net::IpAddr::V6(_)) => format!("{address}/128"),
            _ => format!("{address}/32"),
        })
        .collect();
    policies
        .replace(target.namespace(), &PostParams::default(), &{
            let mut allowed = confined_to(own);
            allowed.metadata.resource_version = policies
                .get(target.namespace())
                .await
                .expect("the policy")
                .metadata
                .resource_version;
            allowed
        })
        .await
        .expect("the endpoints allowed");
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            "lab",
            &PatchParams::default(),
            &Patch::Merge(
                serde_json::json!({"metadata": {"annotations": {"example.com/nudge": "1"}}}),
            ),
        )
        .await
        .expect("the cluster nudged");
    adopted_condition(&target, "lab", reasons::ADOPTED).await;
    policies
        .delete(target.namespace(), &DeleteParams::default())
        .await
        .expect("the policy removed");
    if let Err(error) = specs::wait_ready(&target, "lab", WAIT).await {
        panic!(
            "{error}: {}\n{}",
            specs::summary(&target).await,
            target.manager_log_tail()
        );
    }
    // The user's Secret is named and left alone; freed, Ichor publishes its own (ADR 0053).
    let message = cluster_condition(
        &target,
        "lab",
        conditions::CREDENTIALS_PUBLISHED,
        reasons::SECRET_NAME_TAKEN,
    )
    .await;
    assert!(message.contains("lab-kubeconfig"), "{message}");
    let users = secrets.get("lab-kubeconfig").await.expect("the user's");
    assert_eq!(
        users
            .data
            .as_ref()
            .and_then(|d| d.get(keys::KUBECONFIG_KEY)),
        Some(&ByteString(b"mine".to_vec())),
        "untouched"
    );
    assert!(users.metadata.owner_references.is_none(), "not taken over");
    secrets
        .delete("lab-kubeconfig", &DeleteParams::default())
        .await
        .expect("free the name");
    cluster_condition(
        &target,
        "lab",
        conditions::CREDENTIALS_PUBLISHED,
        reasons::PUBLISHED,
    )
    .await;
    let published = secrets.get("lab-kubeconfig").await.expect("Ichor's");
    assert_eq!(
        published
            .labels()
            .get(labels::PUBLISHED)
            .map(String::as_str),
        Some("true")
    );
    target
        .kubelets_registered("lab")
        .await
        .expect("the workload cluster's Nodes registered");
    let held = try_eventually("drift held on an adopted machine", WAIT, || async {
        let list = machines.list(&ListParams::default()).await.ok()?;
        list.items.iter().find_map(|m| {
            m.status.as_ref()?.conditions.iter().find(|c| {
                c.type_ == conditions::CONFIG_APPLIED && c.reason == reasons::DRIFT_HELD_ADOPTED
            })?;
            Some(())
        })
    })
    .await;
    assert!(held.is_ok(), "{}", specs::summary(&target).await);
    assert_eq!(applies(&target), before, "no node received an apply");
    // Each adopted machine holds the claim on its node's UUID (ADR 0054).
    let claims = Api::<TalosMachineClaim>::all(target.client());
    let held_claims = claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items;
    for machine in machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
    {
        assert!(
            held_claims
                .iter()
                .any(|c| Some(&c.spec.machine.uid) == machine.uid().as_ref()),
            "{} holds no claim: {held_claims:?}",
            machine.name_any()
        );
    }
    for node in target.nodes() {
        assert_eq!(node.calls("Reboot"), 0, "no node was rebooted");
    }

    // Managed from now on: a reboot operation, then a worker's removal.
    let worker = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("the adopted worker");
    specs::create_operation(
        &target,
        TalosOperation::test("reboot-worker", OperationAction::Reboot)
            .cluster("lab")
            .machine(&worker.name_any()),
    )
    .await
    .expect("operation");
    let rebooted = specs::wait_operation(&target, "reboot-worker", WAIT)
        .await
        .expect("finished")
        .status
        .expect("status");
    assert_eq!(
        rebooted.run.phase,
        OperationPhase::Succeeded,
        "{rebooted:?}"
    );
    specs::delete_machine(&target, &endpoints[2])
        .await
        .expect("delete the worker");
    let removed = try_eventually("the worker removed", WAIT, || async {
        machines
            .get_opt(&worker.name_any())
            .await
            .ok()?
            .is_none()
            .then_some(())
    })
    .await;
    if let Err(e) = removed {
        panic!(
            "{e}: {:?}\n{}",
            machines
                .get_opt(&worker.name_any())
                .await
                .ok()
                .flatten()
                .and_then(|m| m.status),
            specs::summary(&target).await
        );
    }
    assert_eq!(
        applies(&target)[..2],
        before[..2],
        "still nothing applied to the others"
    );
    let worker_uid = worker.uid();
    let claims_left = claims
        .list(&ListParams::default())
        .await
        .expect("claims")
        .items;
    assert!(
        !claims_left
            .iter()
            .any(|c| Some(&c.spec.machine.uid) == worker_uid.as_ref()),
        "the removed worker released its claim: {claims_left:?}"
    );
    target.down().await;
}
