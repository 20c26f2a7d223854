//! Declared versions (ADR 0068): `spec.talosVersion` bumped on a Ready cluster upgrades every
//! node, one at a time, control planes first, etcd quorum kept, without Ichor writing the spec;
//! a node that comes back on its old version stops the rollout there; a revert, as a GitOps
//! revert makes, rolls out like any change; an extension added to the cluster's schematic
//! upgrades every node to the same version with the new installer, registered with the Image
//! Factory first (ADR 0067); a class's schematic upgrades only the machines the class approved;
//! a declared upgrade whose drain a PodDisruptionBudget blocks stops there, no node upgraded or
//! rebooted meanwhile, and goes on once the budget allows it (ADR 0066); a declared version
//! waits while the rollout is suspended and outside its maintenance window (ADR 0074).

use std::time::Duration;

use ichor_api::class::{Qualifiers, TalosMachineClassSpec};
use ichor_api::common::{ConditionStatus, LocalObjectReference, Role};
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::{TalosMachine, TalosMachineClass};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_render::schematic::EMPTY_ID;
use ichor_sim::Fault;
use ichor_testenv::nets::DAY2_VERSIONS;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::policy::v1::PodDisruptionBudget;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::set_drain;
use crate::support::cluster::{
    CLUSTER, Monitor, cluster_says, held_by, ready_target, state_summary,
};
use crate::support::workload::{budget, node_name, pod_on, unschedulable};

/// Declares `version` on the cluster, as a person (or Git) does; returns the generation the
/// spec is at then.
async fn declare(target: &SimTarget, version: &str) -> i64 {
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"talosVersion": version}})),
        )
        .await
        .expect("declared")
        .metadata
        .generation
        .expect("generation")
}

/// The cluster's spec generation now.
async fn generation(target: &SimTarget) -> i64 {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .expect("cluster")
        .metadata
        .generation
        .expect("generation")
}

/// The `UpToDate` condition of every machine: (name, status, reason, message).
async fn up_to_date(target: &SimTarget) -> Vec<(String, ConditionStatus, String, String)> {
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    machines
        .list(&Default::default())
        .await
        .expect("machines")
        .items
        .into_iter()
        .filter_map(|m| {
            let c = m
                .status
                .as_ref()?
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::UP_TO_DATE)?
                .clone();
            Some((m.name_any(), c.status, c.reason, c.message))
        })
        .collect()
}

/// Waits until every node runs `version` and every machine says so.
async fn rolled_out(target: &SimTarget, version: &str, limit: Duration) {
    try_eventually(&format!("every node on {version}"), limit, || async {
        let running: Vec<String> = target.nodes().iter().map(|n| n.talos_version()).collect();
        let conditions = up_to_date(target).await;
        let done = running.iter().all(|v| v == version)
            && conditions.len() == running.len()
            && conditions
                .iter()
                .all(|(_, s, r, _)| *s == ConditionStatus::True && r == reasons::RUNS_DECLARED);
        if done {
            Ok(())
        } else {
            Err(format!("{running:?} {conditions:?}"))
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

/// Waits until the cluster's `status.rollout.summary` reads `summary` (any, when empty) and
/// `VersionRolledOut` holds (or not).
async fn rollout_reads(target: &SimTarget, summary: &str, holds: bool) {
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    try_eventually("the cluster's rollout", Duration::from_secs(60), || async {
        let status = clusters
            .get(CLUSTER)
            .await
            .map_err(|e| e.to_string())?
            .status
            .unwrap_or_default();
        let seen = status.core.rollout.as_ref().map(|r| r.summary.clone());
        let condition = status
            .conditions
            .iter()
            .find(|c| c.type_ == conditions::VERSION_ROLLED_OUT)
            .map(|c| (c.status, c.reason.clone()));
        let wanted = if holds {
            ConditionStatus::True
        } else {
            ConditionStatus::False
        };
        match (&seen, &condition) {
            (Some(s), Some((c, _))) if (summary.is_empty() || s == summary) && *c == wanted => {
                Ok(())
            }
            _ => Err(format!("{seen:?} {condition:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

/// Waits until the machines `which` picks (by name) report schematic `id` with the one
/// extension `gvisor`, and every machine's `UpToDate` says it runs the declaration.
async fn on_schematic(target: &SimTarget, id: &str, which: impl Fn(&str) -> bool) {
    try_eventually(
        "the machines on the new schematic",
        Duration::from_secs(240),
        || async {
            let machines: Vec<TalosMachine> =
                Api::<TalosMachine>::namespaced(target.client(), target.namespace())
                    .list(&Default::default())
                    .await
                    .map_err(|e| e.to_string())?
                    .items;
            let on: Vec<_> = machines
                .iter()
                .filter(|m| which(&m.name_any()))
                .map(|m| {
                    let inventory = &m.status.as_ref().expect("status").inventory;
                    (
                        inventory.schematic.clone(),
                        inventory
                            .extensions
                            .iter()
                            .map(|e| e.name.clone())
                            .collect::<Vec<_>>(),
                    )
                })
                .collect();
            let done = !on.is_empty()
                && on
                    .iter()
                    .all(|(s, e)| s.as_deref() == Some(id) && e == &["gvisor".to_owned()]);
            let conditions = up_to_date(target).await;
            let settled = conditions.len() == machines.len()
                && conditions
                    .iter()
                    .all(|(_, s, r, _)| *s == ConditionStatus::True && r == reasons::RUNS_DECLARED);
            if done && settled {
                Ok(())
            } else {
                Err(format!("{on:?} {conditions:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(target)));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_talos_version_rolls_out_one_node_at_a_time_and_a_rollback_stops_it() {
    let target = ready_target(SimOptions::new(3, DAY2_VERSIONS.net(0), "v1.14.1"), 3, 3, 0).await;

    // Refused at the door, naming the field: a Kubernetes minor downgrade, a Talos below the
    // config contract in force, a pair outside Talos's support matrix.
    for (change, field) in [
        (
            json!({"kubernetesVersion": "1.35.2"}),
            "spec.kubernetesVersion 1.35.2 is a minor downgrade",
        ),
        (
            json!({"talosVersion": "v1.13.9"}),
            "spec.talosVersion v1.13.9 is older than the config contract in force, 1.14",
        ),
        (
            json!({"kubernetesVersion": "1.38.0"}),
            "spec.kubernetesVersion 1.38.0 skips a minor version",
        ),
    ] {
        let refused =
            Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
                .patch(
                    CLUSTER,
                    &PatchParams::default(),
                    &Patch::Merge(json!({"spec": change})),
                )
                .await
                .expect_err("refused at the door");
        let kube::Error::Api(status) = refused else {
            panic!("{refused:?}");
        };
        assert_eq!(status.reason, reasons::VERSION_CHANGE_REFUSED, "{status:?}");
        assert!(status.message.contains(field), "{status:?}");
    }

    // v1.14.1 → v1.14.2: every node upgraded, never two down at once, quorum throughout.
    let monitor = Monitor::start(target.nodes().to_vec());
    let declared = declare(&target, "v1.14.2").await;
    rolled_out(&target, "v1.14.2", Duration::from_secs(240)).await;
    let seen = monitor.finish().await;
    assert_eq!(seen.most_down, 1, "one node down at a time: {seen:?}");
    for node in target.nodes() {
        assert_eq!(node.calls("Upgrade"), 1, "each node upgraded once");
    }
    assert_eq!(
        generation(&target).await,
        declared,
        "no controller wrote the cluster's spec"
    );
    rollout_reads(&target, "3/3", true).await;

    // v1.14.3 with a node that Talos rolls back: the rollout stops at it, and no node after
    // it in the order is upgraded.
    target.nodes()[1]
        .inject(Fault::UpgradeRollback(true))
        .await
        .expect("fault");
    declare(&target, "v1.14.3").await;
    let halted = try_eventually("the rollout stopped", Duration::from_secs(240), || async {
        let conditions = up_to_date(&target).await;
        conditions
            .iter()
            .find(|(_, s, r, _)| *s == ConditionStatus::False && r == reasons::UPGRADE_ROLLED_BACK)
            .cloned()
            .ok_or_else(|| format!("{conditions:?}"))
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    assert!(
        halted
            .3
            .contains("the node runs Talos v1.14.2 (Talos rolled it back"),
        "{halted:?}"
    );
    assert_eq!(target.nodes()[1].talos_version(), "v1.14.2");
    let upgraded: usize = target
        .nodes()
        .iter()
        .map(|n| n.calls("Upgrade"))
        .sum::<usize>()
        - 3;
    // Stopped at the node that rolled back: at most the node before it in the order went, and
    // every other node still to be upgraded has looked since and saw the stop.
    let stopped_at = format!("stopped at {}", halted.0);
    try_eventually(
        "the others saw the stop",
        Duration::from_secs(60),
        || async {
            let conditions = up_to_date(&target).await;
            let seen = conditions
                .iter()
                .filter(|(name, ..)| *name != halted.0)
                .all(|(_, s, r, m)| {
                    (*s == ConditionStatus::True && r == reasons::RUNS_DECLARED)
                        || (*s == ConditionStatus::False
                            && r == reasons::UPGRADE_QUEUED
                            && m.contains(&stopped_at))
                });
            if seen {
                Ok(())
            } else {
                Err(format!("{conditions:?}"))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    let after: usize = target
        .nodes()
        .iter()
        .map(|n| n.calls("Upgrade"))
        .sum::<usize>()
        - 3;
    assert_eq!(upgraded, after, "nothing upgraded after the stop");
    assert!(upgraded <= 2, "{upgraded}");
    let clusters: Api<ichor_api::TalosCluster> =
        Api::namespaced(target.client(), target.namespace());
    let halt = clusters
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .and_then(|s| s.drift.halt)
        .expect("the halt recorded on the cluster");
    assert_eq!(halt.machine, halted.0);
    rollout_reads(&target, "", false).await;

    // A GitOps revert to v1.14.2: the halt no longer stands, and the nodes that went to
    // v1.14.3 come back to v1.14.2, one at a time.
    target.nodes()[1]
        .inject(Fault::UpgradeRollback(false))
        .await
        .expect("fault cleared");
    let reverted = declare(&target, "v1.14.2").await;
    rolled_out(&target, "v1.14.2", Duration::from_secs(240)).await;
    assert_eq!(
        generation(&target).await,
        reverted,
        "the spec is the user's"
    );

    // An extension added to the cluster's schematic: the same version, the new installer,
    // every node in turn; each reports the extension and the schematic's ID.
    let schematic = ichor_api::schematic::Schematic {
        system_extensions: vec!["siderolabs/gvisor".into()],
        ..Default::default()
    };
    let id = ichor_render::schematic::id(&schematic).expect("id");
    let upgrades_before: usize = target.nodes().iter().map(|n| n.calls("Upgrade")).sum();
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {
                "imageFactory": {"url": target.factory().url()},
                "schematic": {"systemExtensions": ["siderolabs/gvisor"]},
            }})),
        )
        .await
        .expect("schematic declared");
    on_schematic(&target, &id, |_| true).await;
    let upgrades_after: usize = target.nodes().iter().map(|n| n.calls("Upgrade")).sum();
    assert_eq!(upgrades_after - upgrades_before, 3, "one upgrade per node");
    for node in target.nodes() {
        assert_eq!(node.talos_version(), "v1.14.2", "the same version");
    }
    assert!(
        target.factory().ids().contains(&id),
        "registered with the factory before use"
    );
}

/// Every node's count of calls to `method`, in node order.
fn calls(target: &SimTarget, method: &str) -> Vec<usize> {
    target.nodes().iter().map(|n| n.calls(method)).collect()
}

/// Each machine's spec generation, by name.
async fn machine_generations(target: &SimTarget) -> Vec<(String, Option<i64>)> {
    let mut generations: Vec<_> =
        Api::<TalosMachine>::namespaced(target.client(), target.namespace())
            .list(&Default::default())
            .await
            .expect("machines")
            .items
            .into_iter()
            .map(|m| (m.name_any(), m.metadata.generation))
            .collect();
    generations.sort();
    generations
}

/// The extensions the node at `address` reports (`ExtensionStatuses`, read with Ichor's client
/// through the cluster's talosconfig): their names, and the schematic ID among them.
async fn extensions_at(target: &SimTarget, address: &str) -> (Vec<String>, Option<String>) {
    let credentials = specs::talosconfig_credentials(target, CLUSTER)
        .await
        .expect("talosconfig");
    let client = ichor_talos::TalosClient::connect(address, &credentials)
        .await
        .expect("connect");
    let names = client
        .extensions()
        .await
        .expect("extensions")
        .into_iter()
        .map(|e| e.name)
        .collect();
    let id = client.schematic_id().await.expect("schematic");
    (names, id)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_schematic_reaches_only_the_class_machines() {
    // A control plane and a worker approved by hand, two workers approved by the class `gpu`
    // (by MAC); every node installed from the simulated factory's empty schematic.
    let target = SimTarget::up(SimOptions::new(4, DAY2_VERSIONS.net(2), "v1.14.1"))
        .await
        .expect("sim target");
    let shape = Shape {
        control_planes: 1,
        ..Shape::new("v1.14.1", "flannel")
    };
    let factory = target.factory().url();
    specs::create_cluster_with(&target, &shape, |spec| spec.image_factory.url = factory)
        .await
        .expect("cluster");
    specs::wait_discovered(&target, 4)
        .await
        .expect("discovered");
    let endpoints = target.node_endpoints();
    specs::approve(&target, &endpoints[0], true, "cp-1")
        .await
        .expect("cp-1 approved");
    specs::approve(&target, &endpoints[1], false, "worker-2")
        .await
        .expect("worker-2 approved");
    let mac = |i: usize| target.nodes()[i].hardware().links[0].hardware_addr.clone();
    let classes = Api::<TalosMachineClass>::namespaced(target.client(), target.namespace());
    let gpu = TalosMachineClass::new(
        "gpu",
        TalosMachineClassSpec {
            cluster_ref: LocalObjectReference {
                name: CLUSTER.into(),
            },
            role: Role::Worker,
            qualifiers: Qualifiers {
                mac_addresses: vec![mac(2), mac(3)],
                ..Default::default()
            },
            max_machines: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            rollout: None,
        },
    );
    classes
        .create(&PostParams::default(), &gpu)
        .await
        .expect("class");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(240)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    target
        .kubelets_registered(CLUSTER)
        .await
        .expect("Nodes registered");
    rolled_out(&target, "v1.14.1", Duration::from_secs(60)).await;
    let mut in_class = Vec::new();
    for (i, address) in endpoints.iter().enumerate() {
        let machine = specs::machine_at(&target, address).await.expect("machine");
        let class = machine
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(labels::CLASS).cloned());
        assert_eq!(class.is_some(), i >= 2, "{address}: {class:?}");
        if class.is_some() {
            assert_eq!(class.as_deref(), Some("gpu"));
            in_class.push(machine.name_any());
        }
    }

    // The class declares a schematic with an extension: the same version, a new installer,
    // for its two machines only.
    let schematic = ichor_api::schematic::Schematic {
        system_extensions: vec!["siderolabs/gvisor".into()],
        ..Default::default()
    };
    let id = ichor_render::schematic::id(&schematic).expect("id");
    assert!(!target.factory().ids().contains(&id), "not known before");
    let (upgrades, reboots) = (calls(&target, "Upgrade"), calls(&target, "Reboot"));
    let posts = target.factory().posts();
    let cluster_generation = generation(&target).await;
    let machines_before = machine_generations(&target).await;
    let class_generation = classes
        .patch(
            "gpu",
            &PatchParams::default(),
            &Patch::Merge(
                json!({"spec": {"schematic": {"systemExtensions": ["siderolabs/gvisor"]}}}),
            ),
        )
        .await
        .expect("the class's schematic")
        .metadata
        .generation;
    let image = format!("/metal-installer/{id}:v1.14.1");
    on_schematic(&target, &id, |name| in_class.iter().any(|m| m == name)).await;
    // Each upgrade's Event, which follows its status, names the new installer.
    try_eventually(
        "an Event naming the installer for each",
        Duration::from_secs(30),
        || async {
            let announced = specs::events_with_reason(&target, reasons::UPGRADING).await;
            in_class.iter().all(|name| {
                announced.iter().any(|e| {
                    e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name.as_str())
                        && e.note.as_deref().is_some_and(|n| n.contains(&image))
                })
            })
        },
    )
    .await
    .expect("the upgrades announced");

    // The class's machines upgraded and rebooted once each; the others neither.
    let delta = |after: Vec<usize>, before: &[usize]| -> Vec<usize> {
        after.iter().zip(before).map(|(a, b)| a - b).collect()
    };
    assert_eq!(
        delta(calls(&target, "Upgrade"), &upgrades),
        [0, 0, 1, 1],
        "upgrades, in node order"
    );
    assert_eq!(
        delta(calls(&target, "Reboot"), &reboots),
        [0, 0, 1, 1],
        "reboots, in node order"
    );
    for (i, address) in endpoints.iter().enumerate() {
        assert_eq!(
            target.nodes()[i].talos_version(),
            "v1.14.1",
            "the same version"
        );
        let (names, schematic) = extensions_at(&target, address).await;
        if i >= 2 {
            assert!(names.contains(&"gvisor".to_owned()), "{address}: {names:?}");
            assert_eq!(schematic.as_deref(), Some(id.as_str()), "{address}");
        } else {
            assert!(
                !names.contains(&"gvisor".to_owned()),
                "{address}: {names:?}"
            );
            assert_eq!(schematic.as_deref(), Some(EMPTY_ID), "{address}");
        }
    }
    let announced = specs::events_with_reason(&target, reasons::UPGRADING).await;
    assert!(
        announced.iter().all(|e| e
            .regarding
            .as_ref()
            .and_then(|r| r.name.as_ref())
            .is_some_and(|n| in_class.contains(n))),
        "only the class's machines were upgraded: {announced:?}"
    );
    // Registered with the factory before use: a node pulling an installer whose schematic
    // the factory does not know fails, as a real node's pull does.
    assert!(target.factory().ids().contains(&id), "registered");
    assert!(target.factory().posts() > posts, "POST /schematics");
    // No controller wrote a spec.
    assert_eq!(
        generation(&target).await,
        cluster_generation,
        "the cluster's"
    );
    assert_eq!(
        classes.get("gpu").await.expect("class").metadata.generation,
        class_generation,
        "the class's"
    );
    assert_eq!(
        machine_generations(&target).await,
        machines_before,
        "the machines'"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_upgrade_that_a_budget_blocks_waits_at_the_drain_until_the_budget_allows_it() {
    let target = ready_target(SimOptions::new(3, DAY2_VERSIONS.net(3), "v1.14.1"), 1, 1, 2).await;
    let endpoints = target.node_endpoints();
    let workload = specs::workload_client(&target, CLUSTER)
        .await
        .expect("workload");
    let nodes: Api<Node> = Api::all(workload.clone());
    set_drain(&target, json!({"timeout": "10s"})).await;
    // The control plane goes first, then the workers by name: the first worker's Node holds a
    // pod whose budget allows no disruption.
    let mut workers = Vec::new();
    for (i, address) in endpoints.iter().enumerate().skip(1) {
        let machine = specs::machine_at(&target, address).await.expect("machine");
        workers.push((machine.name_any(), i));
    }
    workers.sort();
    let [(blocked, b), (queued, q)] = [workers[0].clone(), workers[1].clone()];
    let blocked_node = node_name(&target, &endpoints[b]).await;
    pod_on(&workload, "pinned", &blocked_node, json!({"app": "pinned"})).await;
    budget(&workload, "pinned", 1, 1, 0).await;
    let (upgrades, reboots) = (calls(&target, "Upgrade"), calls(&target, "Reboot"));

    let declared = declare(&target, "v1.14.2").await;
    // The drain times out: `Drained` names the pod and the budget, and so does `UpToDate`.
    let (_, _, message) =
        try_eventually("the drain timed out", Duration::from_secs(180), || async {
            specs::machine_condition(&target, &endpoints[b], conditions::DRAINED)
                .await
                .filter(|(holds, reason, _)| !holds && reason == reasons::DRAIN_TIMED_OUT)
        })
        .await
        .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    assert!(
        message.contains("default/pinned (PodDisruptionBudget pinned)"),
        "{message}"
    );
    // Both workers were looked at since: the blocked one waits at its drain, the other for its
    // turn (its message names no machine: it holds until its own turn, ADR 0071), and the
    // cluster names the blocked one in flight.
    try_eventually("the workers wait", Duration::from_secs(60), || async {
        let conditions = up_to_date(&target).await;
        let reason = |name: &str| {
            conditions
                .iter()
                .find(|(n, s, ..)| n == name && *s == ConditionStatus::False)
                .map(|(_, _, r, m)| (r.clone(), m.clone()))
        };
        match (reason(&blocked), reason(&queued)) {
            (Some((at_drain, why)), Some((waits, behind)))
                if at_drain == reasons::DRAIN_TIMED_OUT
                    && why.contains("PodDisruptionBudget pinned")
                    && waits == reasons::UPGRADE_QUEUED
                    && behind.contains("waits for its turn: control planes one at a time") =>
            {
                Ok(())
            }
            _ => Err(format!("{conditions:?}")),
        }
    })
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    try_eventually(
        "the one in flight named",
        Duration::from_secs(60),
        || async {
            let rollout =
                Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
                    .get(CLUSTER)
                    .await
                    .ok()?
                    .status?
                    .core
                    .rollout?;
            (rollout.in_flight.as_deref() == Some(blocked.as_str())).then_some(())
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    let stopped_upgrades = calls(&target, "Upgrade");
    let stopped_reboots = calls(&target, "Reboot");
    // The worker behind it was looked at once the blocked one became next, and waits to be
    // woken when that turn ends (at the settled pace meanwhile, ADR 0071). The blocked one is
    // looked at again while it waits (its evictions retried): its node asked again, in two
    // looks at least, then nothing was sent to any node meanwhile.
    let looked = (
        target.nodes()[b].rpcs(),
        target
            .manager_reconciles("TalosMachine")
            .await
            .expect("metrics"),
    );
    try_eventually(
        "the manager looked again",
        Duration::from_secs(90),
        || async {
            let rpcs = target.nodes()[b].rpcs();
            let reconciles = target
                .manager_reconciles("TalosMachine")
                .await
                .map_err(|e| e.to_string())?;
            if rpcs >= looked.0 + 2 && reconciles >= looked.1 + 2 {
                Ok(())
            } else {
                Err(format!(
                    "{rpcs} Talos calls, {reconciles} reconciles since {looked:?}"
                ))
            }
        },
    )
    .await
    .unwrap_or_else(|e| panic!("{e}\n{}", state_summary(&target)));
    assert_eq!(
        calls(&target, "Upgrade"),
        stopped_upgrades,
        "no upgrade while blocked"
    );
    assert_eq!(
        calls(&target, "Reboot"),
        stopped_reboots,
        "no reboot while blocked"
    );
    for i in [b, q] {
        assert_eq!(
            stopped_upgrades[i], upgrades[i],
            "node {i} was not upgraded"
        );
        assert_eq!(stopped_reboots[i], reboots[i], "node {i} did not reboot");
        assert_eq!(target.nodes()[i].talos_version(), "v1.14.1");
    }
    assert!(unschedulable(&nodes, &blocked_node).await, "cordoned");
    let pods: Api<Pod> = Api::namespaced(workload.clone(), "default");
    assert!(pods.get_opt("pinned").await.expect("get").is_some(), "kept");
    // The cluster says the rollout is not done: the control plane up to date, no upgrade sent
    // to a worker.
    rollout_reads(&target, "1/3", false).await;
    let status = Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .expect("cluster")
        .status
        .expect("status");
    let rolled = status
        .conditions
        .iter()
        .find(|c| c.type_ == conditions::VERSION_ROLLED_OUT)
        .expect("VersionRolledOut");
    assert_eq!(rolled.reason, reasons::VERSION_ROLLING_OUT, "{rolled:?}");
    assert_eq!(
        status.core.rollout.and_then(|r| r.in_flight).as_deref(),
        Some(blocked.as_str()),
        "no upgrade recorded while the drain waits, but the node is in flight under the lock"
    );

    // The budget goes: the pod is evicted, and the rollout completes.
    Api::<PodDisruptionBudget>::namespaced(workload.clone(), "default")
        .delete("pinned", &Default::default())
        .await
        .expect("budget deleted");
    rolled_out(&target, "v1.14.2", Duration::from_secs(240)).await;
    for (i, node) in target.nodes().iter().enumerate() {
        assert_eq!(
            node.calls("Upgrade") - upgrades[i],
            1,
            "node {i} upgraded once"
        );
    }
    assert!(
        pods.get_opt("pinned").await.expect("get").is_none(),
        "evicted"
    );
    for address in &endpoints {
        let name = node_name(&target, address).await;
        assert!(!unschedulable(&nodes, &name).await, "{name} uncordoned");
        assert_eq!(
            specs::machine_condition(&target, address, conditions::DRAINED).await,
            None,
            "{name}"
        );
    }
    assert_eq!(
        generation(&target).await,
        declared,
        "no controller wrote the spec"
    );
    rollout_reads(&target, "3/3", true).await;
}

/// Sets the cluster's `spec.rollout`, as a person (or Git) does.
async fn set_rollout(target: &SimTarget, rollout: serde_json::Value) {
    Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"rollout": rollout}})),
        )
        .await
        .expect("spec.rollout set");
}

/// A rollout on the team's terms (ADR 0074): a version declared while `spec.rollout.suspend`
/// is true upgrades no node; the suspend lifted with a maintenance window not yet open, still
/// none, the condition telling when it opens; once it opens, every node is upgraded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_version_waits_while_suspended_and_outside_its_window_then_rolls_out() {
    let target = ready_target(SimOptions::new(2, DAY2_VERSIONS.net(1), "v1.14.1"), 1, 1, 1).await;
    let upgrades =
        |target: &SimTarget| -> usize { target.nodes().iter().map(|n| n.calls("Upgrade")).sum() };

    set_rollout(&target, json!({"suspend": true})).await;
    let declared = declare(&target, "v1.14.2").await;
    let (_, message) = held_by(&target, reasons::ROLLOUT_SUSPENDED).await;
    assert!(
        message.contains("spec.rollout.suspend is true"),
        "{message}"
    );
    cluster_says(&target, reasons::ROLLOUT_SUSPENDED).await;
    assert_eq!(upgrades(&target), 0, "no node upgraded while suspended");

    // A daily window opening at the next whole minute at least 25 s away (UTC), for 10 min.
    let opens = k8s_openapi::jiff::Timestamp::now()
        .checked_add(k8s_openapi::jiff::SignedDuration::from_secs(25))
        .expect("time")
        .round(
            k8s_openapi::jiff::TimestampRound::new()
                .smallest(k8s_openapi::jiff::Unit::Minute)
                .mode(k8s_openapi::jiff::RoundMode::Ceil),
        )
        .expect("rounded");
    let utc = opens.to_zoned(k8s_openapi::jiff::tz::TimeZone::UTC);
    let schedule = format!("{} {} * * *", utc.minute(), utc.hour());
    set_rollout(
        &target,
        json!({"suspend": false, "maintenanceWindows": [
            {"schedule": schedule, "duration": "10m", "timeZone": "UTC"}
        ]}),
    )
    .await;
    let (_, message) = held_by(&target, reasons::OUTSIDE_MAINTENANCE_WINDOW).await;
    assert!(
        message.contains(&format!("the next opens at {opens}")),
        "{message} (opens {opens})"
    );
    cluster_says(&target, reasons::OUTSIDE_MAINTENANCE_WINDOW).await;
    rolled_out(&target, "v1.14.2", Duration::from_secs(240)).await;
    // Each upgrade was announced, before it was sent, once its window had opened.
    let announced = specs::events_with_reason(&target, reasons::UPGRADING).await;
    assert_eq!(announced.len(), target.nodes().len(), "{announced:?}");
    for event in &announced {
        let at = event.event_time.as_ref().expect("an eventTime").0;
        assert!(
            at >= opens,
            "an upgrade announced at {at}, before its window opened at {opens}"
        );
    }
    for node in target.nodes() {
        assert_eq!(node.calls("Upgrade"), 1, "each node upgraded once");
    }
    assert_eq!(
        generation(&target).await,
        declared + 1,
        "no controller wrote the cluster's spec (one change made by the test after the version)"
    );
}
