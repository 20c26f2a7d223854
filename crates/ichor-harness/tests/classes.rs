//! TalosMachineClass and TalosStorage on the sim target, against the real `ichor-manager`:
//! classes approve the pending machines they alone match, within `maxMachines` and the declared
//! control-plane count, and say on every other match why it waits; a class's patch reaches the
//! machines it approved as drift; a storage's volumes are rendered into the machines it selects
//! (by the role label Ichor sets), and its status reports what Talos reports of them.
//! Also here (one test executable less to link): two namespaces claiming one machine, where
//! only the first claim is acted on (ADR 0054).

use std::time::Duration;

use ichor_api::class::{Qualifiers, TalosMachineClassSpec};
use ichor_api::common::{LocalObjectReference, Role};
use ichor_api::machine::ApprovalState;
use ichor_api::names::{conditions, labels, reasons};
use ichor_api::storage::{Filesystem, TalosStorageSpec, UserVolume};
use ichor_api::{TalosMachine, TalosMachineClass, TalosStorage};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::SimDisk;
use ichor_testenv::nets::{CLAIMS, CLASSES};
use ichor_testenv::wait::try_eventually;
use kube::api::{Api, Patch, PatchParams, PostParams};
use serde_json::json;

const CLUSTER: &str = "lab";
const WAIT: Duration = Duration::from_secs(90);

fn class(name: &str, role: Role, qualifiers: Qualifiers) -> TalosMachineClass {
    TalosMachineClass::new(
        name,
        TalosMachineClassSpec {
            cluster_ref: LocalObjectReference {
                name: CLUSTER.into(),
            },
            role,
            qualifiers,
            max_machines: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            rollout: None,
        },
    )
}

/// Nodes 1–3 have a 1 TB data disk (control-plane material); 4 and 5 an NVMe disk.
fn hardware(host: u8, hardware: &mut ichor_sim::Hardware) {
    let disk = |name: &str, size: u64, transport: &str| SimDisk {
        name: name.into(),
        size,
        cdrom: false,
        transport: transport.into(),
        model: "SIM".into(),
        serial: format!("X{host}"),
    };
    if host <= 3 {
        hardware.disks.push(disk("sdb", 1_000_000_000_000, "sata"));
    } else {
        hardware
            .disks
            .push(disk("nvme0n1", 200_000_000_000, "nvme"));
    }
}

/// The class's `Ready` observed generation: the manager has seen this version of it.
async fn class_seen(target: &SimTarget, name: &str) {
    let api = Api::<TalosMachineClass>::namespaced(target.client(), target.namespace());
    try_eventually(&format!("class {name} seen"), WAIT, || async {
        let class = api.get(name).await.ok()?;
        let generation = class.metadata.generation;
        class
            .status?
            .conditions
            .iter()
            .any(|c| c.type_ == conditions::READY && c.observed_generation == generation)
            .then_some(())
    })
    .await
    .expect("the manager saw the class");
}

/// Waits until `ClassMatched` of the machine at `address` has `reason`; its message.
async fn class_matched(target: &SimTarget, address: &str, reason: &str) -> String {
    let found = try_eventually(
        &format!("{address}: ClassMatched {reason}"),
        WAIT,
        || async {
            specs::machine_condition(target, address, conditions::CLASS_MATCHED)
                .await
                .filter(|(_, r, _)| r == reason)
                .map(|(_, _, m)| m)
        },
    )
    .await;
    match found {
        Ok(message) => message,
        Err(e) => panic!("{e}: {}", specs::summary(target).await),
    }
}

fn label(machine: &TalosMachine, key: &str) -> Option<String> {
    machine.metadata.labels.as_ref()?.get(key).cloned()
}

/// The storage named `data` once its `Ready` reason is `reason`.
async fn storage_ready(target: &SimTarget, reason: &str) -> TalosStorage {
    let api = Api::<TalosStorage>::namespaced(target.client(), target.namespace());
    let found = try_eventually(
        &format!("the storage's Ready reason {reason}"),
        WAIT,
        || async {
            let storage = api.get("data").await.ok()?;
            let ready = storage
                .status
                .as_ref()?
                .conditions
                .iter()
                .any(|c| c.type_ == conditions::READY && c.reason == reason);
            ready.then_some(storage)
        },
    )
    .await;
    match found {
        Ok(storage) => storage,
        Err(e) => panic!(
            "{e}: {:?}\n{}",
            api.get("data").await.ok().and_then(|s| s.status),
            specs::summary(target).await
        ),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn classes_approve_what_they_alone_match_and_storages_report_their_volumes() {
    let version = "v1.14.1";
    let target = SimTarget::up(SimOptions {
        hardware: Some(hardware),
        ..SimOptions::new(5, CLASSES.net(0), version)
    })
    .await
    .expect("sim target");
    specs::create_cluster(&target, &Shape::new(version, "flannel"))
        .await
        .expect("cluster");
    specs::wait_discovered(&target, 5)
        .await
        .expect("discovered");
    let address = |i: usize| target.nodes()[i].addr().ip().to_string();
    let mac = |i: usize| target.nodes()[i].hardware().links[0].hardware_addr.clone();
    let fifth = address(4);

    // Control planes by disk size (nodes 1–3), workers by MAC (node 4); node 5 matches nothing.
    let classes = Api::<TalosMachineClass>::namespaced(target.client(), target.namespace());
    let cp = class(
        "cp",
        Role::ControlPlane,
        Qualifiers {
            min_disk_size: Some("500Gi".into()),
            ..Default::default()
        },
    );
    let workers = class(
        "workers",
        Role::Worker,
        Qualifiers {
            mac_addresses: vec![mac(3)],
            ..Default::default()
        },
    );
    for c in [cp, workers] {
        classes
            .create(&PostParams::default(), &c)
            .await
            .expect("class");
    }
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(240)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    for i in 0..4 {
        let m = specs::machine_at(&target, &address(i))
            .await
            .expect("machine");
        let (role, class) = if i < 3 {
            (Role::ControlPlane, "cp")
        } else {
            (Role::Worker, "workers")
        };
        assert_eq!(m.spec.role, Some(role), "{}", address(i));
        assert_eq!(label(&m, labels::CLASS).as_deref(), Some(class));
        assert_eq!(label(&m, labels::ROLE).as_deref(), Some(role.as_str()));
        let (_, reason, _) =
            specs::machine_condition(&target, &address(i), conditions::CLASS_MATCHED)
                .await
                .expect("ClassMatched");
        assert_eq!(reason, reasons::APPROVED_BY_CLASS);
    }
    // Each approval's Event follows its write: waited for, not read at once.
    let approvals = ichor_testenv::wait::try_eventually(
        "an Event for each of the four approvals",
        Duration::from_secs(30),
        || async {
            let events = specs::events_with_reason(&target, reasons::APPROVED_BY_CLASS).await;
            (events.len() == 4).then_some(())
        },
    )
    .await;
    assert!(
        approvals.is_ok(),
        "an Event records each approval: {:?}",
        specs::events_with_reason(&target, reasons::APPROVED_BY_CLASS)
            .await
            .len()
    );
    let unmatched = specs::machine_at(&target, &fifth).await.expect("machine");
    assert_eq!(unmatched.spec.approval_state, ApprovalState::Pending);
    assert!(
        specs::machine_condition(&target, &fifth, conditions::CLASS_MATCHED)
            .await
            .is_none(),
        "a machine no class matches has no ClassMatched"
    );

    // A fourth control-plane match stays pending, with its reason.
    patch_class(
        &classes,
        "cp",
        json!({"qualifiers": {"minDiskSize": "90Gi"}}),
    )
    .await;
    class_matched(&target, &fifth, reasons::CONTROL_PLANES_FULL).await;
    // An ambiguous match stays pending, naming both classes.
    patch_class(
        &classes,
        "workers",
        json!({"qualifiers": {"macAddresses": [mac(3), mac(4)]}}),
    )
    .await;
    let message = class_matched(&target, &fifth, reasons::CLASS_AMBIGUOUS).await;
    assert!(message.contains("cp and workers"), "{message}");
    let status = classes
        .get("cp")
        .await
        .expect("class")
        .status
        .expect("status");
    assert_eq!(status.matches.machines.len(), 3, "{status:?}");
    assert_eq!(
        status.matches.waiting,
        [unmatched.metadata.name.clone().expect("name")]
    );

    // Both narrowed again: no class matches node 5 any more, and its ClassMatched goes.
    patch_class(
        &classes,
        "workers",
        json!({"qualifiers": {"macAddresses": [mac(3)]}}),
    )
    .await;
    patch_class(
        &classes,
        "cp",
        json!({"qualifiers": {"minDiskSize": "500Gi"}}),
    )
    .await;
    try_eventually("ClassMatched gone from node 5", WAIT, || async {
        specs::machine_condition(&target, &fifth, conditions::CLASS_MATCHED)
            .await
            .is_none()
            .then_some(())
    })
    .await
    .expect("forgotten");

    // Editing a class's role after Ready changes no configured machine.
    let before: Vec<TalosMachine> = machines_of_first(&target, 3).await;
    patch_class(&classes, "cp", json!({"role": "worker"})).await;
    class_seen(&target, "cp").await;
    let after: Vec<TalosMachine> = machines_of_first(&target, 3).await;
    for (b, a) in before.iter().zip(&after) {
        assert_eq!(a.spec.role, Some(Role::ControlPlane));
        assert_eq!(
            a.status
                .as_ref()
                .and_then(|s| s.applied.config_hash.clone()),
            b.status
                .as_ref()
                .and_then(|s| s.applied.config_hash.clone()),
            "no drift on {}",
            a.metadata.name.clone().unwrap_or_default()
        );
    }
    // The worker class takes node 5 again, alone this time, and approves it.
    patch_class(
        &classes,
        "workers",
        json!({"qualifiers": {"macAddresses": [mac(3), mac(4)]}}),
    )
    .await;
    class_matched(&target, &fifth, reasons::APPROVED_BY_CLASS).await;
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }

    // The worker class's patch reaches its machines as drift.
    let applied = |m: &TalosMachine| {
        m.status
            .as_ref()
            .and_then(|s| s.applied.config_hash.clone())
    };
    let fourth_before = applied(
        &specs::machine_at(&target, &address(3))
            .await
            .expect("machine"),
    );
    patch_class(
        &classes,
        "workers",
        json!({"configPatches": [
            {"name": "pool", "documents": {"KubeNodeConfig": {"labels": {"pool": "bulk"}}}}
        ]}),
    )
    .await;
    try_eventually("the class patch applied", WAIT, || async {
        let now = specs::machine_at(&target, &address(3)).await.ok()?;
        (applied(&now) != fourth_before).then_some(())
    })
    .await
    .expect("drift");

    // Two volumes on the workers (by the role label Ichor sets): rendered, applied, observed.
    let storages = Api::<TalosStorage>::namespaced(target.client(), target.namespace());
    let volume = |name: &str, filesystem: Filesystem, max: &str| UserVolume {
        name: name.into(),
        disk_selector: "disk.transport == 'nvme'".into(),
        min_size: Some("1Gi".into()),
        max_size: Some(max.into()),
        filesystem,
    };
    let storage = TalosStorage::new(
        "data",
        TalosStorageSpec {
            cluster_ref: LocalObjectReference {
                name: CLUSTER.into(),
            },
            machine_selector: serde_json::from_value(
                json!({"matchLabels": {labels::ROLE: "worker"}}),
            )
            .ok(),
            volumes: vec![
                volume("data", Filesystem::Xfs, "50Gi"),
                volume("logs", Filesystem::Ext4, "5Gi"),
            ],
        },
    );
    storages
        .create(&PostParams::default(), &storage)
        .await
        .expect("storage");
    let ready = storage_ready(&target, reasons::VOLUMES_READY).await;
    let status = ready.status.expect("status");
    assert_eq!(
        status.volumes.machines.len(),
        2,
        "the two workers: {status:?}"
    );
    assert_eq!(status.volumes.volume_count, Some(4));
    for machine in &status.volumes.machines {
        let names: Vec<(&str, &str)> = machine
            .volumes
            .iter()
            .map(|v| (v.name.as_str(), v.phase.as_str()))
            .collect();
        assert_eq!(names, [("data", "ready"), ("logs", "ready")], "{machine:?}");
        assert!(
            machine.volumes[0]
                .location
                .as_deref()
                .is_some_and(|l| l.starts_with("/dev/nvme0n1")),
            "{machine:?}"
        );
    }

    // A shrink is refused at the door: Talos never shrinks a partition.
    let refused = storages
        .patch(
            "data",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"volumes": [
                volume("data", Filesystem::Xfs, "20Gi"),
                volume("logs", Filesystem::Ext4, "5Gi"),
            ]}})),
        )
        .await
        .expect_err("a shrink");
    assert!(refused.to_string().contains("cannot shrink"), "{refused}");
    target.down().await;
}

/// Merges `spec` into the spec of the TalosMachineClass `name`.
async fn patch_class(classes: &Api<TalosMachineClass>, name: &str, spec: serde_json::Value) {
    let patch = Patch::Merge(json!({"spec": spec}));
    if let Err(error) = classes.patch(name, &PatchParams::default(), &patch).await {
        panic!("merge {patch:?} into the class {name}: {error}");
    }
}

/// The first `n` machines (by node order).
async fn machines_of_first(target: &SimTarget, n: usize) -> Vec<TalosMachine> {
    let mut out = Vec::new();
    for node in &target.nodes()[..n] {
        out.push(
            specs::machine_at(target, &node.addr().ip().to_string())
                .await
                .expect("machine"),
        );
    }
    out
}

/// The second namespace of the claims spec.
const OTHER: &str = "claims-other";

/// Wakes machine `name` (a label changes, so it is looked at again) and waits until its
/// `Ready` condition says `AddressNotAllowed`.
async fn wake_until_refused(
    machines: &Api<TalosMachine>,
    name: &str,
    what: &str,
) -> Result<(), ichor_testenv::wait::Timeout> {
    machines
        .patch(
            name,
            &PatchParams::default(),
            &Patch::Merge(json!({"metadata": {"labels": {"woken": "yes"}}})),
        )
        .await
        .expect("woken");
    try_eventually(what, WAIT, || async {
        let m = machines.get(name).await.ok()?;
        m.status?
            .conditions
            .into_iter()
            .any(|c| c.type_ == conditions::READY && c.reason == reasons::ADDRESS_NOT_ALLOWED)
            .then_some(())
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_namespaces_claiming_one_machine_only_the_first_is_acted_on() {
    use ichor_api::{TalosCluster, TalosMachineClaim};
    use k8s_openapi::api::core::v1::Namespace;
    use k8s_openapi::api::events::v1::Event;
    use kube::ResourceExt as _;
    use kube::api::ListParams;

    let version = "v1.14.1";
    let target = SimTarget::up(SimOptions::new(1, CLAIMS.net(0), version))
        .await
        .expect("sim target");
    let node = &target.nodes()[0];
    let address = node.addr().ip().to_string();
    // A second namespace's cluster (no discovery) is created first, so its bundle is ready.
    Api::<Namespace>::all(target.client())
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({"metadata": {"name": OTHER}})).expect("namespace"),
        )
        .await
        .expect("the other namespace");
    let other_cluster = TalosCluster::test(CLUSTER)
        .namespace(OTHER)
        .talos(version)
        .endpoint(&format!("https://{}:6443", CLAIMS.ip(0, 250)))
        .install_disk("/dev/vda")
        .build();
    Api::<TalosCluster>::namespaced(target.client(), OTHER)
        .create(&PostParams::default(), &other_cluster)
        .await
        .expect("the other cluster");
    let (_, found) = specs::discovered_cluster(&target, version, 1, 1)
        .await
        .expect("discovered");
    let first = &found[0];
    // Discovery claimed the node for the machine it created.
    let claims = Api::<TalosMachineClaim>::all(target.client());
    let claim_name = ichor_api::claim::claim_name(&node.hardware().uuid).expect("a claim name");
    let claim = try_eventually("the discovered machine's claim", WAIT, || async {
        claims.get_opt(&claim_name).await.ok().flatten()
    })
    .await
    .expect("claimed at discovery");
    assert_eq!(claim.spec.machine.namespace, target.namespace());
    assert_eq!(claim.spec.machine.name, first.name_any());

    // The second namespace writes a machine by hand, approved, with the fingerprint the
    // first's status shows: refused, and told so without a word of the first namespace.
    let fingerprint = first.spec.fingerprint.clone().expect("pinned");
    let stolen = TalosMachine::test("stolen")
        .namespace(OTHER)
        .cluster(CLUSTER)
        .at(&address)
        .fingerprint(&fingerprint)
        .control_plane()
        .approved()
        .build();
    let others = Api::<TalosMachine>::namespaced(target.client(), OTHER);
    others
        .create(&PostParams::default(), &stolen)
        .await
        .expect("the hand-written machine");
    let refused = try_eventually("the second machine refused", WAIT, || async {
        let m = others.get("stolen").await.ok()?;
        m.status?
            .conditions
            .into_iter()
            .find(|c| c.type_ == conditions::READY && c.reason == reasons::CLAIMED_ELSEWHERE)
            .map(|c| c.message)
    })
    .await;
    let message = match refused {
        Ok(message) => message,
        Err(e) => panic!(
            "{e}: {:?}",
            others.get("stolen").await.ok().and_then(|m| m.status)
        ),
    };
    // The manager publishes the Event after the status write the spec saw: waited for.
    let event = try_eventually("a Warning Event ClaimedElsewhere", WAIT, || async {
        Api::<Event>::namespaced(target.client(), OTHER)
            .list(&ListParams::default())
            .await
            .ok()?
            .items
            .into_iter()
            .find(|e| e.reason.as_deref() == Some(reasons::CLAIMED_ELSEWHERE))
    })
    .await
    .expect("a Warning Event");
    let note = event.note.clone().unwrap_or_default();
    for text in [&message, &note] {
        assert!(text.contains(&address), "{text}");
        for theirs in [target.namespace(), &first.name_any()] {
            assert!(!text.contains(theirs), "names {theirs}: {text}");
        }
    }

    // The first namespace approves its own: the node gets exactly that one config.
    specs::approve(&target, &address, true, "cp-1")
        .await
        .expect("approved");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(120)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    assert_eq!(node.calls("ApplyConfiguration"), 1);
    let claim = claims.get(&claim_name).await.expect("the claim");
    assert_eq!(claim.spec.machine.name, first.name_any());
    let stolen = others.get("stolen").await.expect("the second machine");
    assert!(stolen.status.and_then(|s| s.applied.config_hash).is_none());

    // Confined to a range without the node's address, the second namespace's machine is not
    // even contacted: its next look (woken by a change) says so.
    let policy = ichor_api::TalosNamespacePolicy::new(
        OTHER,
        ichor_api::claim::TalosNamespacePolicySpec {
            address_ranges: vec![format!("{}/32", CLAIMS.ip(0, 250))],
        },
    );
    Api::<ichor_api::TalosNamespacePolicy>::all(target.client())
        .create(&PostParams::default(), &policy)
        .await
        .expect("the policy");
    wake_until_refused(&others, "stolen", "the second machine's address refused")
        .await
        .expect("AddressNotAllowed");

    // A configured machine's looks read its namespace's policy from the manager's watch
    // (ADR 0062): confined after it was configured, the first machine is refused too.
    let confined = ichor_api::TalosNamespacePolicy::new(target.namespace(), policy.spec.clone());
    Api::<ichor_api::TalosNamespacePolicy>::all(target.client())
        .create(&PostParams::default(), &confined)
        .await
        .expect("the first namespace's policy");
    let mine = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    let what = "the configured machine's address refused";
    wake_until_refused(&mine, &first.name_any(), what)
        .await
        .expect("AddressNotAllowed on the configured machine");
    assert_eq!(
        node.calls("ApplyConfiguration"),
        1,
        "nothing more was applied"
    );
    target.down().await;
}
