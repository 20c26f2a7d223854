//! What the manager refuses and reports: a secretsRef naming no Secret, a node older than the
//! cluster's contract, one SMBIOS UUID answering with two certificates, pending and rejected
//! machines; and the generated bundle Secret carries no owner reference. A class never approves
//! past the declared control planes, even from a view of the machines older than an approval.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::names::{conditions, reasons};
use ichor_api::testing::ClusterBuilder;
use ichor_api::{TalosCluster, TalosMachine};
use ichor_sim::{Hardware, SimNode, Stage};
use ichor_testenv::nets::MANAGER_CHECKS;
use ichor_testenv::wait::eventually;
use k8s_openapi::api::core::v1::{Event, Secret};
use kube::ResourceExt as _;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use serde_json::json;

/// A one-control-plane cluster `name` discovering 127.0.`net`.0/24.
fn cluster(ns: &str, name: &str, net: u8) -> ClusterBuilder {
    TalosCluster::test(name)
        .namespace(ns)
        .endpoint(&format!("https://127.0.{net}.1:6443"))
        .discovery(&[format!("127.0.{net}.0/24")], "10s")
        .install_disk("/dev/vda")
}

fn condition(c: &TalosCluster, type_: &str) -> Option<(String, String)> {
    c.status
        .as_ref()?
        .conditions
        .iter()
        .find(|x| x.type_ == type_)
        .map(|x| (x.reason.clone(), x.message.clone()))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusals_and_reports() {
    let (env, ns) = support::plane("checks").await;
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);

    // An old node, and two machines sharing one SMBIOS UUID.
    let old = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(0, 1), 50000)),
        "v1.13.9",
        Hardware::vm(6201),
    )
    .await
    .expect("old node");
    let twin_a = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(1, 1), 50000)),
        "v1.14.1",
        Hardware::vm(6301),
    )
    .await
    .expect("twin");
    let twin_b = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(1, 2), 50000)),
        "v1.14.1",
        Hardware::vm(6301),
    )
    .await
    .expect("twin");

    for c in [
        cluster(&ns, "old", MANAGER_CHECKS.net(0)).build(),
        cluster(&ns, "twins", MANAGER_CHECKS.net(1)).build(),
        cluster(&ns, "missing", MANAGER_CHECKS.net(2))
            .secrets("nope")
            .build(),
    ] {
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    let (stop_tx, manager) = support::start_manager(&env);

    // secretsRef naming nothing: SecretsReady false, saying what to do.
    eventually(
        "SecretsBundleUnavailable",
        Duration::from_secs(60),
        || async {
            clusters
                .get("missing")
                .await
                .ok()
                .and_then(|c| condition(&c, conditions::SECRETS_READY))
                .is_some_and(|(reason, message)| {
                    reason == reasons::SECRETS_BUNDLE_UNAVAILABLE && message.contains("nope")
                })
        },
    )
    .await;

    // A generated bundle outlives its cluster: no owner reference.
    eventually("the generated bundle", Duration::from_secs(60), || async {
        Api::<Secret>::namespaced(env.client(), &ns)
            .get_opt("old-secrets")
            .await
            .ok()
            .flatten()
            .is_some()
    })
    .await;
    let bundle = Api::<Secret>::namespaced(env.client(), &ns)
        .get("old-secrets")
        .await
        .expect("bundle");
    assert!(
        bundle
            .metadata
            .owner_references
            .unwrap_or_default()
            .is_empty()
    );

    // One UUID, two certificates: reported, not recorded.
    eventually(
        "the UUID conflict event",
        Duration::from_secs(60),
        || async {
            Api::<Event>::namespaced(env.client(), &ns)
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| {
                    l.items.iter().any(|e| {
                        e.message
                            .as_deref()
                            .unwrap_or_default()
                            .contains("different certificates")
                    })
                })
        },
    )
    .await;
    let recorded = machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items;
    assert!(
        recorded.iter().all(|m| m.spec.cluster_ref.name != "twins"),
        "no record for a conflicting UUID"
    );

    // A node older than the contract is refused before anything is applied.
    eventually(
        "the old machine discovered",
        Duration::from_secs(60),
        || async {
            machines
                .list(&ListParams::default())
                .await
                .is_ok_and(|l| l.items.iter().any(|m| m.spec.cluster_ref.name == "old"))
        },
    )
    .await;
    let name = machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .find(|m| m.spec.cluster_ref.name == "old")
        .expect("old machine")
        .name_any();
    let ready_reason = |name: String| {
        let machines = machines.clone();
        async move {
            machines
                .get(&name)
                .await
                .ok()
                .and_then(|m| m.status)
                .and_then(|s| {
                    s.conditions
                        .into_iter()
                        .find(|c| c.type_ == conditions::READY)
                })
                .map(|c| c.reason)
        }
    };
    eventually("AwaitingApproval", Duration::from_secs(60), || async {
        ready_reason(name.clone()).await.as_deref() == Some(reasons::AWAITING_APPROVAL)
    })
    .await;
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "approved", "role": "controlplane"}})),
        )
        .await
        .expect("approve");
    eventually("TalosVersionTooOld", Duration::from_secs(60), || async {
        machines
            .get(&name)
            .await
            .ok()
            .and_then(|m| m.status)
            .is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::READY && c.reason == reasons::TALOS_VERSION_TOO_OLD
                })
            })
    })
    .await;
    assert_eq!(old.stage().await, Stage::Maintenance, "nothing applied");
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "rejected"}})),
        )
        .await
        .expect("reject");
    eventually("Rejected", Duration::from_secs(60), || async {
        ready_reason(name.clone()).await.as_deref() == Some(reasons::REJECTED)
    })
    .await;

    let _ = stop_tx.send(());
    let _ = manager.await;
    for node in [old, twin_a, twin_b] {
        node.stop().await;
    }
}

/// The config a control plane of a cluster behind `endpoint` runs, from `bundle`.
fn running_config(bundle: &ichor_render::SecretsBundle, endpoint: &str) -> String {
    let spec = TalosCluster::test("again").endpoint(endpoint).spec();
    ichor_render::render(&ichor_render::RenderInput::plain(
        "again",
        &spec,
        ichor_api::common::Role::ControlPlane,
        bundle,
    ))
    .expect("render")
    .yaml
}

/// Whether an Event with `reason` whose note contains `needle` was recorded in `ns`.
async fn event_seen(env: &ichor_testenv::TestEnv, ns: &str, reason: &str, needle: &str) -> bool {
    Api::<Event>::namespaced(env.client(), ns)
        .list(&ListParams::default())
        .await
        .is_ok_and(|l| {
            l.items.iter().any(|e| {
                e.reason.as_deref() == Some(reason)
                    && e.message.as_deref().unwrap_or_default().contains(needle)
            })
        })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_users_secret_is_never_taken_over_and_running_nodes_get_no_new_bundle() {
    use ichor_api::names::{labels, secrets as keys};
    use k8s_openapi::ByteString;
    use kube::Resource as _;
    use kube::api::{DeleteParams, ObjectMeta};

    let (env, ns) = support::plane("published").await;
    let clusters: Api<TalosCluster> = Api::namespaced(env.client(), &ns);
    let secrets: Api<Secret> = Api::namespaced(env.client(), &ns);
    let secret = |name: &str, key: &str, value: &[u8]| Secret {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        data: Some([(key.to_owned(), ByteString(value.to_vec()))].into()),
        ..Default::default()
    };
    // A user's Secret under the name the talosconfig of `lab` is published under.
    let users = secrets
        .create(
            &PostParams::default(),
            &secret("lab-talosconfig", keys::TALOSCONFIG_KEY, b"mine"),
        )
        .await
        .expect("the user's Secret");
    // A node that already runs at the endpoint of `again`, a cluster created anew without its
    // status or its bundle Secret.
    let bundle =
        ichor_render::SecretsBundle::generate(ichor_render::Contract::V1_14).expect("bundle");
    let running = MANAGER_CHECKS.ip(2, 9);
    let endpoint = format!("https://{running}:6443");
    let node = SimNode::start_configured(
        SocketAddr::from((running, 50000)),
        "v1.14.1",
        Hardware::vm(6409),
        &running_config(&bundle, &endpoint),
    )
    .await
    .expect("a running node");
    // A machine of `lab` whose applied-config name a user's Secret holds.
    let fresh = SimNode::start_with(
        SocketAddr::from((MANAGER_CHECKS.ip(2, 10), 50000)),
        "v1.14.1",
        Hardware::vm(6410),
    )
    .await
    .expect("a maintenance node");
    let applied = secrets
        .create(
            &PostParams::default(),
            &secret("cp-1-applied-config", keys::APPLIED_CONFIG_KEY, b"mine"),
        )
        .await
        .expect("the user's Secret");
    let address = MANAGER_CHECKS.ip(2, 10).to_string();
    support::create_machine(
        &env,
        &ns,
        support::lab_control_plane(&ns, &address).fingerprint(&fresh.fingerprint()),
    )
    .await;
    for c in [
        TalosCluster::test("lab")
            .namespace(&ns)
            .endpoint(&format!("https://{}:6443", MANAGER_CHECKS.ip(2, 8)))
            .install_disk("/dev/vda")
            .build(),
        TalosCluster::test("again")
            .namespace(&ns)
            .endpoint(&endpoint)
            .build(),
    ] {
        clusters
            .create(&PostParams::default(), &c)
            .await
            .expect("create");
    }
    // A cluster whose talosconfig an earlier Ichor wrote: managed-by ichor, the cluster its
    // controller, no published label.
    let earlier = clusters
        .create(
            &PostParams::default(),
            &TalosCluster::test("earlier")
                .namespace(&ns)
                .endpoint(&format!("https://{}:6443", MANAGER_CHECKS.ip(2, 7)))
                .build(),
        )
        .await
        .expect("create");
    let mut written = secret("earlier-talosconfig", keys::TALOSCONFIG_KEY, b"stale");
    written.metadata.labels = Some(
        [(
            labels::MANAGED_BY.to_owned(),
            labels::MANAGED_BY_VALUE.to_owned(),
        )]
        .into(),
    );
    written.metadata.owner_references = earlier.controller_owner_ref(&()).map(|o| vec![o]);
    secrets
        .create(&PostParams::default(), &written)
        .await
        .expect("an earlier Ichor's Secret");
    let (stop_tx, manager) = support::start_manager(&env);

    let reason_of = |name: &'static str, type_: &'static str| {
        let clusters = clusters.clone();
        async move {
            clusters
                .get(name)
                .await
                .ok()
                .and_then(|c| condition(&c, type_))
        }
    };
    // Written by an earlier Ichor: still Ichor's, labelled and rewritten.
    eventually(
        "the earlier Secret adopted",
        Duration::from_secs(60),
        || async {
            let adopted = secrets
                .get_opt("earlier-talosconfig")
                .await
                .ok()
                .flatten()
                .is_some_and(|s| {
                    s.labels().get(labels::PUBLISHED).is_some()
                        && s.data.as_ref().and_then(|d| d.get(keys::TALOSCONFIG_KEY))
                            != Some(&ByteString(b"stale".to_vec()))
                });
            adopted
                && reason_of("earlier", conditions::CREDENTIALS_PUBLISHED)
                    .await
                    .is_some_and(|(reason, _)| reason == reasons::PUBLISHED)
        },
    )
    .await;

    // The name is taken: said on the cluster and in an Event, the Secret left as it was.
    eventually("SecretNameTaken", Duration::from_secs(60), || async {
        reason_of("lab", conditions::CREDENTIALS_PUBLISHED)
            .await
            .is_some_and(|(reason, message)| {
                reason == reasons::SECRET_NAME_TAKEN && message.contains("lab-talosconfig")
            })
    })
    .await;
    eventually("its Event", Duration::from_secs(30), || {
        event_seen(&env, &ns, reasons::SECRET_NAME_TAKEN, "lab-talosconfig")
    })
    .await;
    let after = secrets.get("lab-talosconfig").await.expect("still there");
    assert_eq!(
        after.metadata.resource_version, users.metadata.resource_version,
        "never written"
    );
    assert_eq!(after.data, users.data);
    assert!(after.metadata.owner_references.is_none());
    let status = clusters
        .get("lab")
        .await
        .expect("lab")
        .status
        .expect("status");
    assert_eq!(status.core.talosconfig_secret, None, "not named as Ichor's");

    // The machine's applied config cannot be kept: nothing is applied, the Secret untouched.
    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);
    eventually("the machine stopped", Duration::from_secs(60), || async {
        machines
            .get("cp-1")
            .await
            .ok()
            .and_then(|m| m.status)
            .is_some_and(|s| {
                s.conditions.iter().any(|c| {
                    c.type_ == conditions::READY
                        && c.reason == reasons::SECRET_NAME_TAKEN
                        && c.message.contains("cp-1-applied-config")
                })
            })
    })
    .await;
    assert_eq!(fresh.config_applies(), 0, "nothing applied");
    let kept = secrets
        .get("cp-1-applied-config")
        .await
        .expect("still there");
    assert_eq!(
        kept.metadata.resource_version,
        applied.metadata.resource_version
    );

    // Nodes that run: no bundle generated, the address named, and what to do.
    let address = running.to_string();
    eventually(
        "SecretsBundleNotGenerated",
        Duration::from_secs(60),
        || async {
            reason_of("again", conditions::SECRETS_READY)
                .await
                .is_some_and(|(reason, message)| {
                    reason == reasons::SECRETS_BUNDLE_NOT_GENERATED
                        && message.contains(&address)
                        && message.contains("again-secrets")
                })
        },
    )
    .await;
    eventually("its Event", Duration::from_secs(30), || {
        event_seen(&env, &ns, reasons::SECRETS_BUNDLE_NOT_GENERATED, &address)
    })
    .await;
    assert!(
        secrets
            .get_opt("again-secrets")
            .await
            .expect("read")
            .is_none(),
        "no bundle generated"
    );

    // The name freed: Ichor publishes its own, labelled and owned by the cluster.
    secrets
        .delete("lab-talosconfig", &DeleteParams::default())
        .await
        .expect("free the name");
    let uid = clusters.get("lab").await.expect("lab").uid();
    eventually("published", Duration::from_secs(60), || async {
        let published = secrets.get_opt("lab-talosconfig").await.ok().flatten();
        let ours = published.is_some_and(|s| {
            s.labels().get(labels::PUBLISHED).map(String::as_str) == Some("true")
                && s.owner_references()
                    .iter()
                    .any(|o| Some(&o.uid) == uid.as_ref() && o.controller == Some(true))
        });
        ours && reason_of("lab", conditions::CREDENTIALS_PUBLISHED)
            .await
            .is_some_and(|(reason, _)| reason == reasons::PUBLISHED)
    })
    .await;

    // The bundle restored: the cluster uses it.
    let yaml = bundle.to_yaml().expect("yaml");
    secrets
        .create(
            &PostParams::default(),
            &secret("again-secrets", keys::BUNDLE_KEY, yaml.as_bytes()),
        )
        .await
        .expect("restore the bundle");
    eventually("BundleValid", Duration::from_secs(60), || async {
        reason_of("again", conditions::SECRETS_READY)
            .await
            .is_some_and(|(reason, _)| reason == reasons::BUNDLE_VALID)
    })
    .await;

    let _ = stop_tx.send(());
    let _ = manager.await;
    node.stop().await;
}

/// Creates the TalosMachine `name` in `ns` (pending: nothing reconciles it here) and returns
/// it as stored, with its uid.
async fn stored_machine(env: &ichor_testenv::TestEnv, ns: &str, name: &str) -> TalosMachine {
    Api::<TalosMachine>::namespaced(env.client(), ns)
        .create(
            &PostParams::default(),
            &TalosMachine::test(name).namespace(ns).build(),
        )
        .await
        .expect("machine")
}

/// Waits (30 s at most) until the claim `name` is gone: `what` says whose release it was.
async fn claim_gone(claims: &Api<ichor_api::TalosMachineClaim>, name: &str, what: &str) {
    eventually(what, Duration::from_secs(30), || async {
        claims.get_opt(name).await.ok().is_some_and(|c| c.is_none())
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_uuid_is_claimed_by_exactly_one_machine() {
    use ichor_api::TalosMachineClaim;
    use ichor_manager::claims;

    let (env, first_ns) = support::plane("claim-a").await;
    let second_ns = env.namespace("claim-b").await.expect("namespace");
    let client = env.client();
    let claims_api: Api<TalosMachineClaim> = Api::all(client.clone());
    let uuid = "4C4C4544-0042-3610-8052-B4C04F4B4E32";
    let name = "4c4c4544-0042-3610-8052-b4c04f4b4e32";

    // Eight machines in two namespaces race for one UUID: the apiserver lets one create win.
    let mut contenders = Vec::new();
    for i in 0..8 {
        let ns = if i % 2 == 0 { &first_ns } else { &second_ns };
        contenders.push(stored_machine(&env, ns, &format!("m-{i}")).await);
    }
    let outcomes = futures::future::join_all(
        contenders
            .iter()
            .map(|m| claims::take(&client, m, uuid, "fp", "10.0.0.1")),
    )
    .await;
    let winners: Vec<&TalosMachine> = contenders
        .iter()
        .zip(&outcomes)
        .filter(|(_, o)| matches!(o, Ok(Ok(()))))
        .map(|(m, _)| m)
        .collect();
    assert_eq!(winners.len(), 1, "exactly one holder: {outcomes:?}");
    let winner = winners[0];
    for outcome in &outcomes {
        match outcome {
            Ok(Ok(())) => {}
            Ok(Err(refusal)) => {
                assert_eq!(refusal.reason, reasons::CLAIMED_ELSEWHERE);
                assert!(!refusal.message.contains(&first_ns), "{}", refusal.message);
                assert!(!refusal.message.contains(&second_ns), "{}", refusal.message);
            }
            Err(error) => panic!("a claim errs: {error}"),
        }
    }
    let claim = claims_api.get(name).await.expect("the claim");
    assert_eq!(claim.spec.machine, claims::holder(winner));

    // Taken again by its holder: held. Seen by another with another certificate: a conflict.
    assert!(matches!(
        claims::take(&client, winner, uuid, "fp", "10.0.0.1").await,
        Ok(Ok(()))
    ));
    let loser = contenders
        .iter()
        .find(|m| m.uid() != winner.uid())
        .expect("a loser");
    let conflict = claims::take(&client, loser, uuid, "other-fp", "10.0.0.2")
        .await
        .expect("answered")
        .expect_err("a conflict is not a claim");
    assert_eq!(conflict.reason, reasons::UUID_CONFLICT);

    // A claim never changes hands by an update.
    let mut moved = claim.clone();
    moved.spec.machine = claims::holder(loser);
    let refused = claims_api
        .replace(name, &PostParams::default(), &moved)
        .await
        .expect_err("the apiserver refuses a claim changing hands");
    assert!(
        refused.to_string().contains("never changes hands"),
        "{refused}"
    );

    // A released claim goes (only the holder's), and the next machine takes it.
    assert_eq!(claims::release(&client, loser).await.expect("release"), 0);
    assert_eq!(claims::release(&client, winner).await.expect("release"), 1);
    assert!(claims_api.get_opt(name).await.expect("read").is_none());
    assert!(matches!(
        claims::take(&client, loser, uuid, "other-fp", "10.0.0.2").await,
        Ok(Ok(()))
    ));

    // Its holder deleted without a release (a crash between steps): the claim is stale, and
    // another machine takes it over.
    Api::<TalosMachine>::namespaced(client.clone(), &loser.namespace().unwrap_or_default())
        .delete(&loser.name_any(), &Default::default())
        .await
        .expect("delete the holder");
    let heir = contenders
        .iter()
        .find(|m| m.uid() != winner.uid() && m.uid() != loser.uid())
        .expect("a third machine");
    assert!(matches!(
        claims::take(&client, heir, uuid, "fp", "10.0.0.1").await,
        Ok(Ok(()))
    ));
    let claim = claims_api.get(name).await.expect("the claim");
    assert_eq!(claim.spec.machine, claims::holder(heir));

    // A UUID that cannot name an object is never claimed.
    let unusable = claims::take(&client, heir, "../x", "fp", "10.0.0.1")
        .await
        .expect("answered")
        .expect_err("refused");
    assert_eq!(unusable.reason, reasons::UUID_UNUSABLE);

    // Rejecting the holder releases its claim (the manager's machine controller).
    let (stop, manager) = support::start_manager(&env);
    Api::<TalosMachine>::namespaced(client.clone(), &heir.namespace().unwrap_or_default())
        .patch(
            &heir.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "rejected"}})),
        )
        .await
        .expect("rejected");
    claim_gone(&claims_api, name, "the rejected machine's claim released").await;

    // Deleting a pending holder (no finalizer, so no reconcile follows) releases its claim
    // too: the manager's machine watch sees the delete.
    let last = contenders
        .iter()
        .find(|m| ![winner.uid(), loser.uid(), heir.uid()].contains(&m.uid()))
        .expect("a fourth machine");
    assert!(matches!(
        claims::take(&client, last, uuid, "fp", "10.0.0.1").await,
        Ok(Ok(()))
    ));
    Api::<TalosMachine>::namespaced(client.clone(), &last.namespace().unwrap_or_default())
        .delete(&last.name_any(), &Default::default())
        .await
        .expect("delete the pending holder");
    claim_gone(&claims_api, name, "the deleted machine's claim released").await;
    let _ = stop.send(());
    manager.await.expect("the manager stops");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_class_approves_on_the_machines_as_stored_not_on_an_older_view() {
    use ichor_api::class::{Qualifiers, TalosMachineClassSpec};
    use ichor_api::common::{LocalObjectReference, Role};
    use ichor_api::machine::{
        ApprovalState, HardwareInventory, MachineInventory, TalosMachineSpec, TalosMachineStatus,
    };
    use ichor_manager::controller::cluster::approval;
    use ichor_manager::infra::status::{self, Guard};
    use ichor_manager::{Context, Metrics, Settings};
    use std::sync::Arc;

    // A certificate fingerprint as the CRD takes it (43 base64 characters and a pad).
    const PIN: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
    let (env, ns) = support::plane("class-stale").await;
    let machines: Api<TalosMachine> = Api::namespaced(env.client(), &ns);
    let cluster = Api::<TalosCluster>::namespaced(env.client(), &ns)
        .create(
            &PostParams::default(),
            &TalosCluster::test("lab")
                .namespace(&ns)
                .control_planes(1)
                .build(),
        )
        .await
        .expect("cluster");
    let mut class = ichor_api::TalosMachineClass::new(
        "cp",
        TalosMachineClassSpec {
            cluster_ref: LocalObjectReference { name: "lab".into() },
            role: Role::ControlPlane,
            qualifiers: Qualifiers {
                cidrs: vec!["10.9.0.0/24".into()],
                ..Default::default()
            },
            max_machines: None,
            install: None,
            schematic: None,
            config_patches: Vec::new(),
            rollout: None,
        },
    );
    class.metadata.namespace = Some(ns.clone());
    Api::<ichor_api::TalosMachineClass>::namespaced(env.client(), &ns)
        .create(&PostParams::default(), &class)
        .await
        .expect("class");
    // Two pending machines for one control-plane place: m1 outside the class's range, m2 in it.
    let mut pending = Vec::new();
    for (name, address) in [("m1", "10.9.1.1"), ("m2", "10.9.0.2")] {
        let machine = TalosMachine::discovered(
            &ns,
            name,
            name,
            TalosMachineSpec::pending("lab", address, PIN),
        );
        let created = machines
            .create(&PostParams::default(), &machine)
            .await
            .expect("machine");
        let seen = TalosMachineStatus {
            inventory: MachineInventory {
                address: Some(address.into()),
                observed_fingerprint: Some(PIN.into()),
                hardware: Some(HardwareInventory {
                    uuid: name.into(),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        status::apply::<MachineInventory, _>(&machines, &created, &seen, Guard::None)
            .await
            .expect("inventory");
        pending.push(machines.get(name).await.expect("machine"));
    }
    let ctx = Context::new(
        env.client(),
        Settings::default(),
        Arc::new(Metrics::default()),
    );
    for (_, watch) in ctx.layers.watches(&env.client()) {
        tokio::spawn(watch);
    }
    // A person approves m1 as the control plane; the class is then handed a view older than
    // that approval, as a reconcile reading a cache that has not caught up could be.
    machines
        .patch(
            "m1",
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"approvalState": "approved", "role": "controlplane"}})),
        )
        .await
        .expect("approved by hand");
    approval::apply_classes(&ctx, &cluster, &pending)
        .await
        .expect("the class's pass");
    let approved: Vec<String> = machines
        .list(&ListParams::default())
        .await
        .expect("list")
        .items
        .into_iter()
        .filter(|m| m.spec.approval_state == ApprovalState::Approved)
        .map(|m| m.name_any())
        .collect();
    assert_eq!(approved, ["m1"], "one control-plane place, one approval");
}
