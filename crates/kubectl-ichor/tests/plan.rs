//! `kubectl ichor plan` against the sim e2e target (a real apiserver and etcd, simulated Talos
//! nodes, the real `ichor-manager` and `ichor-webhook`): its prediction for a Talos version
//! bump, and for a config patch the nodes take only with a reboot, matches what the manager
//! then does, machine by machine and in order. The plugin runs as a person with read-only
//! permissions would: get and list on Ichor's kinds, no Secret, no write.
//! Build the manager and webhook first: `cargo build -p ichor-manager -p ichor-webhook --bins`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_api::common::ConditionStatus;
use ichor_api::names::{conditions, reasons};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::Fault;
use ichor_testenv::nets::KUBECTL_PLAN;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::{Value, json};

/// The read-only user the plugin runs as (impersonated by the test's administrator).
const VIEWER: &str = "plan-viewer";

/// What one run printed.
#[derive(Debug)]
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

/// The plugin as a read-only person runs it.
struct Viewer {
    kubeconfig: PathBuf,
    context: String,
    namespace: String,
}

impl Viewer {
    /// A kubeconfig of the target's administrator impersonating [`VIEWER`], who may get and
    /// list Ichor's kinds in the target's namespace and nothing else.
    async fn new(target: &SimTarget) -> Self {
        let namespace = target.namespace().to_owned();
        let role: Role = serde_json::from_value(json!({
            "metadata": {"name": VIEWER, "namespace": namespace},
            "rules": [{
                "apiGroups": ["ichor.maesh.dev"],
                "resources": ["talosclusters", "talosmachines", "talosmachineclasses", "talosstorages"],
                "verbs": ["get", "list"]
            }]
        }))
        .expect("role");
        Api::<Role>::namespaced(target.client(), &namespace)
            .create(&PostParams::default(), &role)
            .await
            .expect("the viewer's Role");
        let binding: RoleBinding = serde_json::from_value(json!({
            "metadata": {"name": VIEWER, "namespace": namespace},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": VIEWER},
            "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": VIEWER}]
        }))
        .expect("binding");
        Api::<RoleBinding>::namespaced(target.client(), &namespace)
            .create(&PostParams::default(), &binding)
            .await
            .expect("the viewer's RoleBinding");
        let mut config: Value = serde_saphyr::from_str(target.kubeconfig()).expect("kubeconfig");
        for user in config["users"].as_array_mut().expect("users") {
            user["user"]["as"] = json!(VIEWER);
        }
        let kubeconfig = target.dir().join("viewer.kubeconfig");
        std::fs::write(&kubeconfig, serde_json::to_string(&config).expect("json"))
            .expect("write the kubeconfig");
        Self {
            kubeconfig,
            context: target.context().to_owned(),
            namespace,
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
        Run {
            code: output.status.code().unwrap_or(-1),
            stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
            stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
        }
    }

    /// The plan of `file` as JSON, and as a person reads it.
    async fn plan(&self, file: &Path) -> (Value, String) {
        let path = file.to_str().expect("a UTF-8 path");
        let json = self.run(&["plan", "-f", path, "-o", "json"]).await;
        assert_eq!(json.code, 0, "plan -o json failed: {json:?}");
        let table = self.run(&["plan", "-f", path]).await;
        assert_eq!(table.code, 0, "plan failed: {table:?}");
        eprintln!("kubectl ichor plan -f {path}\n{}", table.stdout);
        (
            serde_json::from_str(&json.stdout).expect("the plan as JSON"),
            table.stdout,
        )
    }
}

/// The cluster as stored, with `edit` made to its spec, written as a manifest a person would
/// commit (no status, no server-set metadata).
async fn manifest(
    target: &SimTarget,
    name: &str,
    file: &str,
    edit: impl FnOnce(&mut Value),
) -> PathBuf {
    let live = Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .get(name)
        .await
        .expect("the live cluster");
    let mut spec = serde_json::to_value(&live.spec).expect("spec");
    edit(&mut spec);
    let doc = json!({
        "apiVersion": "ichor.maesh.dev/v1alpha1",
        "kind": "TalosCluster",
        "metadata": {"name": name, "namespace": target.namespace()},
        "spec": spec,
    });
    let path = target.dir().join(file);
    std::fs::write(&path, serde_saphyr::to_string(&doc).expect("yaml")).expect("write");
    path
}

/// Applies the manifest's spec to the live cluster, as a merge of what changed.
async fn apply(target: &SimTarget, name: &str, spec: Value) {
    Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": spec })),
        )
        .await
        .expect("the change applied");
}

/// The batches of a plan, in order.
fn batches(plan: &Value) -> Vec<Vec<String>> {
    plan["batches"]
        .as_array()
        .expect("batches")
        .iter()
        .map(|b| {
            b["machines"]
                .as_array()
                .expect("machines")
                .iter()
                .map(|m| m.as_str().expect("a name").to_owned())
                .collect()
        })
        .collect()
}

/// The machines named by Events of `reason` seen at `since` or later, in the order of their
/// first such Event (an Event repeated later counts at its last observation).
async fn order_of(target: &SimTarget, reason: &str, since: Timestamp) -> Vec<String> {
    let mut seen: Vec<(Timestamp, String)> = specs::events_with_reason(target, reason)
        .await
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.kind.as_deref()) == Some("TalosMachine"))
        .filter_map(|e| {
            let when = e
                .series
                .as_ref()
                .map(|s| s.last_observed_time.0)
                .or_else(|| e.event_time.as_ref().map(|t| t.0))
                .or_else(|| e.deprecated_first_timestamp.as_ref().map(|t| t.0))?;
            Some((when, e.regarding?.name?))
        })
        .filter(|(when, _)| *when >= since)
        .collect();
    seen.sort();
    let mut order: Vec<String> = Vec::new();
    for (_, name) in seen {
        if !order.contains(&name) {
            order.push(name);
        }
    }
    order
}

/// Waits until every machine says `type_` holds.
async fn every_machine(target: &SimTarget, type_: &str, what: &str, limit: Duration) {
    let machines: Api<ichor_api::TalosMachine> =
        Api::namespaced(target.client(), target.namespace());
    try_eventually(what, limit, || async {
        let list = machines
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let missing: Vec<String> = list
            .items
            .iter()
            .filter(|m| {
                !m.status.as_ref().is_some_and(|s| {
                    s.conditions
                        .iter()
                        .any(|c| c.type_ == type_ && c.status == ConditionStatus::True)
                })
            })
            .map(|m| m.name_any())
            .collect();
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!("{missing:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
}

/// Waits until the cluster's condition `type_` holds.
async fn cluster_holds(target: &SimTarget, name: &str, type_: &str) {
    try_eventually(
        &format!("{type_} on the cluster"),
        Duration::from_secs(120),
        || async { specs::cluster_condition(target, name, type_).await },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
}

/// Waits until no machine has a step in flight: no upgrade, reboot for drift or drain recorded.
async fn settled(target: &SimTarget) {
    let machines: Api<ichor_api::TalosMachine> =
        Api::namespaced(target.client(), target.namespace());
    try_eventually("no step in flight", Duration::from_secs(120), || async {
        let list = machines
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let busy: Vec<String> = list
            .items
            .iter()
            .filter(|m| {
                m.status.as_ref().is_some_and(|s| {
                    s.upgrade.record.is_some()
                        || s.drift.reboot.is_some()
                        || s.drain.record.is_some()
                })
            })
            .map(|m| m.name_any())
            .collect();
        if busy.is_empty() {
            Ok(())
        } else {
            Err(format!("{busy:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
}

/// Waits until every machine records Talos `version` and no upgrade in flight.
async fn upgraded_to(target: &SimTarget, version: &str) {
    let machines: Api<ichor_api::TalosMachine> =
        Api::namespaced(target.client(), target.namespace());
    let limit = Duration::from_secs(240);
    try_eventually(&format!("every machine on {version}"), limit, || async {
        let list = machines
            .list(&ListParams::default())
            .await
            .map_err(|e| e.to_string())?;
        let left: Vec<String> = list
            .items
            .iter()
            .filter(|m| {
                !m.status.as_ref().is_some_and(|s| {
                    s.inventory.talos_version.as_deref() == Some(version)
                        && s.upgrade.record.is_none()
                        && s.drain.record.is_none()
                })
            })
            .map(|m| m.name_any())
            .collect();
        if left.is_empty() {
            Ok(())
        } else {
            Err(format!("{left:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
}

/// A sim target on block `net` of [`KUBECTL_PLAN`] with a Ready cluster of one control plane
/// and two workers; its name.
async fn ready_cluster(net: u8) -> (SimTarget, String) {
    let target = SimTarget::up(SimOptions::new(3, net, "v1.14.1"))
        .await
        .expect("sim target");
    let (shape, _) = specs::discovered_cluster(&target, "v1.14.1", 1, 3)
        .await
        .expect("cluster discovered");
    specs::approve_shape(&target, 1, 2).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, &shape.name, Duration::from_secs(180)).await {
        panic!("{error}; machines: {}", specs::summary(&target).await);
    }
    // The workload cluster's API and its kubelets: each disruption drains its Node first.
    target
        .kubelets_registered(&shape.name)
        .await
        .expect("Nodes registered");
    let limit = Duration::from_secs(120);
    every_machine(&target, conditions::READY, "every machine Ready", limit).await;
    (target, shape.name)
}

/// (a) Talos v1.14.1 -> v1.14.2: every machine upgraded after a drain, the control plane
/// first, then the workers one at a time by name; the manager's `Upgrading` Events come in
/// the planned order.
async fn version_bump(target: &SimTarget, viewer: &Viewer, name: &str) {
    let bump = manifest(target, name, "bump.yaml", |spec| {
        spec["talosVersion"] = json!("v1.14.2");
    })
    .await;
    let (plan, table) = viewer.plan(&bump).await;
    assert!(
        table.contains("spec.talosVersion: v1.14.1 -> v1.14.2"),
        "{table}"
    );
    assert!(
        plan["refused"].as_array().expect("refused").is_empty(),
        "{plan}"
    );
    let machines = plan["machines"].as_array().expect("machines");
    assert_eq!(machines.len(), 3, "{plan}");
    for m in machines {
        assert_eq!(m["change"], "upgrade", "{m}");
        assert_eq!(m["drain"], "yes", "{m}");
        assert!(
            m["upgradeTo"]
                .as_str()
                .is_some_and(|i| i.ends_with(":v1.14.2")),
            "{m}"
        );
    }
    let predicted = batches(&plan);
    assert_eq!(predicted.len(), 3, "one machine a batch: {plan}");
    let since = Timestamp::now();
    apply(target, name, json!({"talosVersion": "v1.14.2"})).await;
    upgraded_to(target, "v1.14.2").await;
    cluster_holds(target, name, conditions::VERSION_ROLLED_OUT).await;
    settled(target).await;
    let limit = Duration::from_secs(120);
    every_machine(
        target,
        conditions::READY,
        "every machine Ready again",
        limit,
    )
    .await;
    let upgraded = order_of(target, reasons::UPGRADING, since).await;
    assert_eq!(
        upgraded,
        predicted.concat(),
        "upgraded in the planned order"
    );
}

/// (b) A config patch each node takes only with a reboot (the simulator's `RequireReboot`):
/// predicted live (Talos 1.14; the node decides), and rebooted by the manager after the
/// node's refusal, in the planned order (`RebootForDrift` Events).
async fn patch_needing_reboot(target: &SimTarget, viewer: &Viewer, name: &str) {
    for node in target.nodes() {
        node.inject(Fault::RequireReboot(true))
            .await
            .expect("fault");
    }
    let patches = json!([{"name": "san", "machine": {"certSANs": ["plan.example.internal"]}}]);
    let patched = manifest(target, name, "patch.yaml", |spec| {
        spec["configPatches"] = patches.clone();
    })
    .await;
    let (plan, table) = viewer.plan(&patched).await;
    assert!(table.contains("spec.configPatches added"), "{table}");
    for m in plan["machines"].as_array().expect("machines") {
        assert_eq!(m["change"], "config", "{m}");
        assert_eq!(m["how"], "live", "{m}");
        assert_eq!(m["predicted"], true, "{m}");
    }
    assert!(table.contains("live is a prediction"), "{table}");
    let predicted = batches(&plan);
    assert_eq!(predicted.len(), 3, "{plan}");
    let since = Timestamp::now();
    apply(target, name, json!({"configPatches": patches})).await;
    let limit = Duration::from_secs(240);
    try_eventually("every machine rebooted for its drift", limit, || async {
        order_of(target, reasons::REBOOT_FOR_DRIFT, since)
            .await
            .len()
            == 3
    })
    .await
    .unwrap_or_else(|e| panic!("{e}: {}", target.manager_log_tail()));
    cluster_holds(target, name, conditions::CONFIG_ROLLED_OUT).await;
    settled(target).await;
    let rebooted = order_of(target, reasons::REBOOT_FOR_DRIFT, since).await;
    assert_eq!(
        rebooted,
        predicted.concat(),
        "rebooted in the planned order"
    );
    for node in target.nodes() {
        node.inject(Fault::RequireReboot(false))
            .await
            .expect("fault cleared");
    }
}

/// `maxUnavailable: 2` with Talos v1.14.2: the control plane alone, then both workers in one
/// batch; the manager upgrades the control plane first, then the two workers.
async fn batch_of_workers(target: &SimTarget, viewer: &Viewer, name: &str) {
    let rollout = json!({"maxUnavailable": 2});
    let file = manifest(target, name, "batch.yaml", |spec| {
        spec["talosVersion"] = json!("v1.14.2");
        spec["rollout"] = rollout.clone();
    })
    .await;
    let (plan, _) = viewer.plan(&file).await;
    let predicted = batches(&plan);
    assert_eq!(
        predicted.len(),
        2,
        "the control plane, then both workers: {plan}"
    );
    assert_eq!(predicted[1].len(), 2, "{plan}");
    let since = Timestamp::now();
    apply(
        target,
        name,
        json!({"talosVersion": "v1.14.2", "rollout": rollout}),
    )
    .await;
    upgraded_to(target, "v1.14.2").await;
    settled(target).await;
    let upgraded = order_of(target, reasons::UPGRADING, since).await;
    assert_eq!(upgraded.len(), 3, "{upgraded:?}");
    assert_eq!(upgraded[..1], predicted[0], "the control plane first");
    let mut workers = upgraded[1..].to_vec();
    workers.sort();
    assert_eq!(workers, predicted[1], "then the workers' batch");
}

/// Bad input: a cluster not found live, a window that does not read, a file that holds no
/// TalosCluster: each named, with what is allowed; exit code 1, no panic.
async fn bad_input(target: &SimTarget, viewer: &Viewer, name: &str) {
    let missing = manifest(target, name, "missing.yaml", |_| {}).await;
    let text = std::fs::read_to_string(&missing).expect("read");
    std::fs::write(
        &missing,
        text.replace(&format!("name: {name}"), "name: nope"),
    )
    .expect("write");
    let run = viewer
        .run(&["plan", "-f", missing.to_str().expect("path")])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains("TalosCluster nope (the live copy of"),
        "{run:?}"
    );
    assert!(run.stderr.contains("not found in namespace"), "{run:?}");
    let window = manifest(target, name, "window.yaml", |spec| {
        spec["rollout"] = json!({"maintenanceWindows": [{"schedule": "0 25 * * *", "duration": "4h", "timeZone": "UTC"}]});
    })
    .await;
    let run = viewer
        .run(&["plan", "-f", window.to_str().expect("path")])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr.contains(
            "spec.rollout.maintenanceWindows[0]: schedule \"0 25 * * *\" is not a five-field cron expression"
        ),
        "{run:?}"
    );
    let other = target.dir().join("deployment.yaml");
    std::fs::write(
        &other,
        "apiVersion: apps/v1\nkind: Deployment\nmetadata:\n  name: web\n",
    )
    .expect("write");
    let run = viewer
        .run(&["plan", "-f", other.to_str().expect("path")])
        .await;
    assert_eq!(run.code, 1, "{run:?}");
    assert!(
        run.stderr
            .contains("holds no TalosCluster (kind Deployment"),
        "{run:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_plan_matches_what_the_manager_then_does_node_by_node() {
    let (target, name) = ready_cluster(KUBECTL_PLAN.net(0)).await;
    let viewer = Viewer::new(&target).await;
    // The viewer reads no Secret: `render`, which does, is refused.
    let machines = Api::<ichor_api::TalosMachine>::namespaced(target.client(), target.namespace())
        .list(&ListParams::default())
        .await
        .expect("machines");
    let render = viewer.run(&["render", &machines.items[0].name_any()]).await;
    assert_eq!(render.code, 1, "{render:?}");
    assert!(render.stderr.contains("forbidden"), "{render:?}");
    version_bump(&target, &viewer, &name).await;
    patch_needing_reboot(&target, &viewer, &name).await;
    bad_input(&target, &viewer, &name).await;
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_workers_goes_as_planned() {
    let (target, name) = ready_cluster(KUBECTL_PLAN.net(1)).await;
    let viewer = Viewer::new(&target).await;
    batch_of_workers(&target, &viewer, &name).await;
    target.down().await;
}
