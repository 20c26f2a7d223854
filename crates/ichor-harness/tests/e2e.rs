//! The sim e2e: the spec set against the sim target — real apiserver and etcd, simulated
//! Talos nodes, and the real `ichor-manager` and `ichor-webhook` binaries running as their
//! ServiceAccount users with the shipped RBAC.

use std::time::Duration;

use ichor_api::TalosMachine;
use ichor_api::names::{conditions, reasons};
use ichor_harness::specs::{self, Shape};
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_sim::{Fault, Stage};
use ichor_testenv::nets::E2E;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::admissionregistration::v1::ValidatingWebhookConfiguration;
use kube::ResourceExt as _;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_lifecycle_on_contract_1_14() {
    // Installed as the Helm chart installs it: the webhook fills an empty certificate Secret.
    let target = SimTarget::up(SimOptions {
        empty_cert_secret: true,
        ..SimOptions::new(5, E2E.net(0), "v1.14.1")
    })
    .await
    .expect("sim target");
    specs::lifecycle(&target, &Shape::new("v1.14.1", "flannel"))
        .await
        .expect("lifecycle");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sim_lifecycle_on_contract_1_13_with_cni_none() {
    // With CNI none, nodeReady stays unmet: the control planes must still all join.
    let target = SimTarget::up(SimOptions::new(5, E2E.net(5), "v1.13.9"))
        .await
        .expect("sim target");
    specs::lifecycle(&target, &Shape::new("v1.13.9", "none"))
        .await
        .expect("lifecycle");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_fingerprints_are_flagged_and_never_applied_to() {
    let target = SimTarget::up(SimOptions::new(2, E2E.net(1), "v1.14.1"))
        .await
        .expect("sim target");
    specs::discovered_cluster(&target, "v1.14.1", 1, 2)
        .await
        .expect("cluster discovered");
    let endpoints = target.node_endpoints();

    // A pending machine reboots: a new maintenance certificate. Discovery flags it.
    let rebooted = &target.nodes()[0];
    let pinned = rebooted.fingerprint();
    rebooted.reboot().await.expect("reboot");
    let fresh = rebooted.fingerprint();
    assert_ne!(pinned, fresh);
    try_eventually("FingerprintChanged", Duration::from_secs(30), || async {
        specs::machine_condition(&target, &endpoints[0], conditions::FINGERPRINT_CHANGED)
            .await
            .is_some_and(|(holds, _, _)| holds)
    })
    .await
    .expect("flagged");
    let machine = specs::machine_at(&target, &endpoints[0])
        .await
        .expect("machine");
    assert_eq!(
        machine.spec.fingerprint.as_deref(),
        Some(pinned.as_str()),
        "the pin is kept"
    );
    specs::approve(&target, &endpoints[0], true, "cp-1")
        .await
        .expect("approve");
    // The manager had its chance: it refused the apply and said why.
    try_eventually(
        "the apply refused on the pin",
        Duration::from_secs(30),
        || async {
            specs::machine_condition(&target, &endpoints[0], conditions::READY)
                .await
                .is_some_and(|(_, reason, message)| {
                    reason == reasons::FINGERPRINT_MISMATCH && message.contains(&fresh)
                })
        },
    )
    .await
    .expect("refused while the pin differs");
    assert_eq!(
        rebooted.stage().await,
        Stage::Maintenance,
        "nothing applied while the pin differs"
    );
    assert_eq!(rebooted.calls("ApplyConfiguration"), 0, "never sent");

    // A person confirms it is the same machine: the pin is updated, and the apply goes ahead.
    Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .patch(
            &machine.name_any(),
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"fingerprint": fresh}})),
        )
        .await
        .expect("update the pin");
    try_eventually("the config applied", Duration::from_secs(60), || async {
        specs::machine_at(&target, &endpoints[0])
            .await
            .ok()
            .and_then(|m| m.status)
            .is_some_and(|s| s.applied.config_hash.is_some())
    })
    .await
    .expect("applied after the pin update");

    // A certificate that changes between discovery and apply is refused, naming both.
    let other = &target.nodes()[1];
    let discovered = other.fingerprint();
    let now = other
        .inject(Fault::DifferentCertificate)
        .await
        .expect("fault");
    specs::approve(&target, &endpoints[1], false, "worker-2")
        .await
        .expect("approve");
    try_eventually("FingerprintMismatch", Duration::from_secs(30), || async {
        specs::machine_condition(&target, &endpoints[1], conditions::READY)
            .await
            .is_some_and(|(_, reason, message)| {
                reason == reasons::FINGERPRINT_MISMATCH
                    && message.contains(&discovered)
                    && message.contains(&now)
            })
    })
    .await
    .expect("refused with both fingerprints");
    assert_eq!(other.stage().await, Stage::Maintenance);
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn killing_the_manager_at_each_step_ends_in_one_cluster() {
    // No not-ready window: the first Bootstrap held at the reply gate is the one that acts.
    let mut options = SimOptions::new(3, E2E.net(2), "v1.14.1");
    options.timings.bootstrap_window = Duration::ZERO;
    let mut target = SimTarget::up(options).await.expect("sim target");
    let shape = Shape::new("v1.14.1", "flannel");
    specs::create_cluster(&target, &shape)
        .await
        .expect("cluster");
    specs::wait_discovered(&target, 3)
        .await
        .expect("discovered");

    // Kill point 1: during the apply to the first control plane.
    let apply_gate = target.nodes()[0].gate("ApplyConfiguration");
    // Kill point 3, armed now: Bootstrap runs on the node, its answer is held.
    let bootstrap_gates: Vec<_> = target
        .nodes()
        .iter()
        .map(|n| n.gate_reply("Bootstrap"))
        .collect();
    specs::approve_all(&target, &shape).await.expect("approve");
    apply_gate.arrived(1).await;
    target.kill_manager().await;
    apply_gate.release();
    target.start_manager().await.expect("restart");

    // Kill point 2: while a node installs (1.14: stage booting, the unattended install's
    // phase installing).
    try_eventually("a node installing", Duration::from_secs(60), || async {
        for node in target.nodes() {
            if node.stage().await == Stage::Installing
                || node
                    .unattended_install()
                    .await
                    .is_some_and(|(phase, _)| phase == "installing")
            {
                return true;
            }
        }
        false
    })
    .await
    .expect("installing");
    target.kill_manager().await;
    target.start_manager().await.expect("restart");

    // Kill point 3: after a successful Bootstrap, before the manager could record it. (A
    // control plane answers over mutual TLS while it still installs, where Talos refuses
    // Bootstrap as not available yet: those answers are held too, until a call succeeds.)
    let deadline = std::time::Instant::now() + Duration::from_secs(90);
    loop {
        let mut bootstrapped = false;
        for (gate, node) in bootstrap_gates.iter().zip(target.nodes()) {
            bootstrapped |= gate.count() > 0 && node.etcd_member_id().await.is_some();
        }
        if bootstrapped {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "no Bootstrap ever succeeded"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    target.kill_manager().await;
    drop(bootstrap_gates);
    target.start_manager().await.expect("restart");

    specs::wait_ready(&target, &shape.name, Duration::from_secs(180))
        .await
        .expect("Ready");
    specs::check_cluster(&target, &shape)
        .await
        .expect("one etcd cluster, three voters");
    target.down().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn removing_a_control_plane_runs_the_whole_sequence_and_waits_without_a_replacement() {
    let target = SimTarget::up(SimOptions::new(4, E2E.net(6), "v1.14.1"))
        .await
        .expect("sim target");
    let shape = Shape::new("v1.14.1", "flannel");
    specs::create_cluster(&target, &shape)
        .await
        .expect("cluster");
    specs::wait_discovered(&target, 4)
        .await
        .expect("discovered");
    let endpoints = target.node_endpoints();
    for (i, address) in endpoints.iter().take(3).enumerate() {
        specs::approve(&target, address, true, &format!("cp-{}", i + 1))
            .await
            .expect("approve");
    }
    try_eventually(
        "three Ready control planes",
        Duration::from_secs(120),
        || async {
            specs::cluster_condition(&target, "lab", conditions::BOOTSTRAPPED).await
                && specs::machine_condition(&target, &endpoints[2], conditions::READY)
                    .await
                    .is_some_and(|(ready, _, _)| ready)
        },
    )
    .await
    .expect("three control planes");
    // A fourth control plane joins: etcd 3 -> 4.
    specs::approve(&target, &endpoints[3], true, "cp-4")
        .await
        .expect("approve the fourth");
    specs::wait_ready(&target, "lab", Duration::from_secs(120))
        .await
        .expect("Ready with four");
    target.kubelets_registered("lab").await.expect("Nodes");
    let four = Shape {
        control_planes: 4,
        ..shape.clone()
    };
    specs::check_cluster(&target, &four)
        .await
        .expect("four voters");

    // Delete cp-3 (annotated): the whole sequence runs, etcd 4 -> 3.
    let removed = specs::machine_at(&target, &endpoints[2])
        .await
        .expect("cp-3");
    let configured_fingerprint = target.nodes()[2].fingerprint();
    let machines: Api<TalosMachine> = Api::namespaced(target.client(), target.namespace());
    forged_reviews_reserve_nothing(&target, &removed).await;
    let removal_started = std::time::Instant::now();
    specs::delete_machine(&target, &endpoints[2])
        .await
        .expect("the webhook admits 4 -> 3");
    try_eventually(
        "the machine record gone",
        Duration::from_secs(120),
        || async {
            machines
                .get_opt(&removed.name_any())
                .await
                .is_ok_and(|m| m.is_none())
        },
    )
    .await
    .unwrap_or_else(|e| {
        let m = removal_status(&target, &endpoints[2]);
        panic!("{e}: {m:?}\nmanager log:\n{}", target.manager_log_tail())
    });
    eprintln!("removal 4 -> 3 took {:?}", removal_started.elapsed());
    try_eventually(
        "the node back in maintenance",
        Duration::from_secs(30),
        || async { target.nodes()[2].stage().await == Stage::Maintenance },
    )
    .await
    .expect("reset to maintenance");
    assert_ne!(target.nodes()[2].fingerprint(), configured_fingerprint);
    let credentials = specs::talosconfig_credentials(&target, "lab")
        .await
        .expect("talosconfig");
    let cp1 = ichor_talos::TalosClient::connect(&endpoints[0], &credentials)
        .await
        .expect("cp-1");
    let members = cp1.etcd_members(false).await.expect("members");
    assert_eq!(members.len(), 3, "{members:?}");
    assert!(!members.iter().any(|m| m.hostname == "cp-3"));
    let workload = specs::workload_client(&target, "lab")
        .await
        .expect("workload");
    let nodes: Api<k8s_openapi::api::core::v1::Node> = Api::all(workload);
    assert!(
        nodes.get_opt("cp-3").await.expect("get").is_none(),
        "its Node is gone"
    );

    // Without a replacement, deleting another control plane waits and leaves etcd alone.
    specs::delete_machine(&target, &endpoints[1])
        .await
        .expect("admitted: 3 -> 2 keeps quorum");
    let started = std::time::Instant::now();
    let seen = std::sync::Mutex::new(Vec::<Option<String>>::new());
    let waited = try_eventually("AwaitingReplacement", Duration::from_secs(60), || async {
        let now = specs::machine_condition(&target, &endpoints[1], conditions::REMOVAL_APPROVED)
            .await
            .map(|(_, reason, message)| format!("{reason}: {message}"));
        let mut seen = seen.lock().expect("seen");
        if seen.last() != Some(&now) {
            seen.push(now.clone());
        }
        now.is_some_and(|c| c.starts_with(reasons::AWAITING_REPLACEMENT))
    })
    .await;
    let seen = seen.into_inner().expect("seen");
    if let Err(error) = waited {
        panic!(
            "{error}: conditions seen {seen:?}\nmanager log:\n{}",
            target.manager_log_tail()
        );
    }
    eprintln!(
        "AwaitingReplacement after {:?}: {seen:?}",
        started.elapsed()
    );
    assert_eq!(
        cp1.etcd_members(false).await.expect("members").len(),
        3,
        "etcd untouched"
    );
    target.down().await;
}

/// The removal progress of the machine at `address`, for failure messages.
/// POSTs `review` to the webhook's port as a caller other than the apiserver, presenting
/// `client` (or no certificate): the reply's JSON, or why there is none.
async fn post_to_webhook(
    target: &SimTarget,
    review: &serde_json::Value,
    client: Option<&ichor_testenv::CertAndKey>,
) -> Result<serde_json::Value, String> {
    use rustls::pki_types::pem::PemObject as _;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer};

    let config = Api::<ValidatingWebhookConfiguration>::all(target.client())
        .get(ichor_api::admission::WEBHOOK_CONFIGURATION)
        .await
        .map_err(|e| e.to_string())?;
    let bundle = config.webhooks.unwrap_or_default()[0]
        .client_config
        .ca_bundle
        .clone()
        .expect("the webhook injected its CA")
        .0;
    let mut roots = rustls::RootCertStore::empty();
    for cert in CertificateDer::pem_slice_iter(&bundle) {
        roots.add(cert.expect("a certificate")).expect("a root");
    }
    let builder = rustls::ClientConfig::builder_with_provider(std::sync::Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots);
    let tls = match client {
        Some(client) => builder
            .with_client_auth_cert(
                CertificateDer::pem_slice_iter(client.cert_pem.as_bytes())
                    .collect::<Result<Vec<_>, _>>()
                    .expect("a certificate"),
                PrivateKeyDer::from_pem_slice(client.key_pem.as_bytes()).expect("a key"),
            )
            .expect("a client identity"),
        None => builder.with_no_client_auth(),
    };
    let http = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .build()
        .expect("an HTTP client");
    let reply = http
        .post(target.webhook_url())
        .header("content-type", "application/json")
        .body(review.to_string())
        .send()
        .await
        .map_err(|e| format!("{e:?}"))?;
    let text = reply.text().await.map_err(|e| format!("{e:?}"))?;
    serde_json::from_str(&text).map_err(|e| format!("{e}: {text}"))
}

/// A DELETE review of `machine` as the apiserver would send it (the live object), POSTed straight
/// to the webhook's port without the apiserver's client certificate, and with one of another
/// CA: refused, and no removal reserved on the cluster (ADR 0051).
async fn forged_reviews_reserve_nothing(target: &SimTarget, machine: &TalosMachine) {
    let live = Api::<TalosMachine>::namespaced(target.client(), target.namespace())
        .get(&machine.name_any())
        .await
        .expect("the machine");
    let review = ichor_api::testing::machine_review(
        "forged",
        "DELETE",
        &live.name_any(),
        target.namespace(),
        Some(serde_json::to_value(&live).expect("json")),
    );
    let answer = post_to_webhook(target, &review, None)
        .await
        .expect("an answer to a caller without a certificate");
    assert_eq!(answer["response"]["allowed"], false, "{answer}");
    assert_eq!(
        answer["response"]["status"]["reason"],
        reasons::CLIENT_CERTIFICATE_REQUIRED,
        "{answer}"
    );
    let stranger = ichor_testenv::pki::new_ca_named("stranger")
        .and_then(|ca| ichor_testenv::pki::client_cert(&ca, "kube-apiserver", None))
        .expect("a certificate of another CA");
    let refused = post_to_webhook(target, &review, Some(&stranger)).await;
    assert!(refused.is_err(), "another CA's certificate: {refused:?}");
    let cluster = Api::<ichor_api::TalosCluster>::namespaced(target.client(), target.namespace())
        .get("lab")
        .await
        .expect("the cluster");
    assert!(
        ichor_api::reservation::reservations(&cluster).is_empty(),
        "a forged review reserved a removal"
    );
}

fn removal_status(target: &SimTarget, address: &str) -> Option<String> {
    let handle = tokio::runtime::Handle::current();
    tokio::task::block_in_place(|| {
        handle.block_on(async {
            specs::machine_at(target, address)
                .await
                .ok()
                .and_then(|m| m.status)
                .map(|s| format!("{:?} {:?}", s.removal.progress, s.conditions))
        })
    })
}

/// The BMC's password: long enough for the secret scan to look for it.
const BMC_PASSWORD: &str = "bmc-e2e-password-7Hq2";
/// A password the BMC does not take (also scanned for).
const WRONG_BMC_PASSWORD: &str = "bmc-e2e-wrong-password-9Kd4";

/// Node 1's BMC: a read-only user would do; the simulator's account is an administrator.
fn bmc_of(host: u8) -> Option<ichor_sim::BmcSpec> {
    (host == 1).then(|| ichor_sim::BmcSpec::new("ichor", BMC_PASSWORD))
}

/// Creates (or replaces) Secret `name` holding `data`.
async fn put_secret(target: &SimTarget, name: &str, data: &[(&str, &str)]) {
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            ..Default::default()
        },
        string_data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        ),
        ..Default::default()
    };
    Api::<k8s_openapi::api::core::v1::Secret>::namespaced(target.client(), target.namespace())
        .patch(
            name,
            &PatchParams::apply("e2e").force(),
            &Patch::Apply(&secret),
        )
        .await
        .expect("the Secret");
}

/// The machine's `status.bmc` and `BmcReachable` once `BmcReachable` has `reason`.
async fn bmc_seen(
    target: &SimTarget,
    name: &str,
    reason: &str,
) -> (ichor_api::bmc::BmcObservation, ichor_api::common::Condition) {
    let api = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    let seen = try_eventually(
        &format!("BmcReachable {reason}"),
        Duration::from_secs(90),
        || async {
            let status = api.get(name).await.ok()?.status?;
            let condition = status
                .conditions
                .iter()
                .find(|c| c.type_ == conditions::BMC_REACHABLE && c.reason == reason)?
                .clone();
            Some((status.bmc.observed?, condition))
        },
    )
    .await;
    match seen {
        Ok(seen) => seen,
        Err(error) => panic!("{error}\nmanager log:\n{}", target.manager_log_tail()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_machine_shows_its_bmcs_power_and_health_and_wrong_credentials_block_nothing() {
    let target = SimTarget::up(SimOptions {
        bmc: Some(bmc_of),
        ..SimOptions::new(1, E2E.net(3), "v1.14.1")
    })
    .await
    .expect("sim target");
    specs::discovered_cluster(&target, "v1.14.1", 1, 1)
        .await
        .expect("cluster discovered");
    specs::approve_shape(&target, 1, 0).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, "lab", Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    let bmc = target.nodes()[0].bmc().expect("node 1 has a BMC").clone();
    put_secret(
        &target,
        "node-1-bmc",
        &[("username", "ichor"), ("password", BMC_PASSWORD)],
    )
    .await;
    put_secret(
        &target,
        "node-1-bmc-wrong",
        &[("username", "ichor"), ("password", WRONG_BMC_PASSWORD)],
    )
    .await;
    put_secret(&target, "bmc-ca", &[("ca.crt", &bmc.ca_pem())]).await;
    let address = target.node_endpoints()[0].clone();
    let machine = specs::machine_at(&target, &address).await.expect("machine");
    let name = machine.name_any();
    let machines = Api::<TalosMachine>::namespaced(target.client(), target.namespace());
    let name_bmc = |secret: &str| {
        json!({"spec": {"bmc": {
            "address": bmc.url(),
            "credentialsSecretRef": {"name": secret},
            "caSecretRef": {"name": "bmc-ca", "key": "ca.crt"}
        }}})
    };
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(name_bmc("node-1-bmc")),
        )
        .await
        .expect("spec.bmc");

    // Read: the power state, health and system as the BMC reports them.
    let (observed, reachable) = bmc_seen(&target, &name, reasons::BMC_OBSERVED).await;
    assert_eq!(reachable.status, ichor_api::common::ConditionStatus::True);
    assert_eq!(observed.power_state.as_deref(), Some("On"));
    assert_eq!(observed.health.as_deref(), Some("OK"));
    assert!(observed.system_id.is_some(), "{observed:?}");
    assert!(observed.uuid.is_some(), "{observed:?}");

    // Wrong credentials: BmcReachable false with the client's reason, a Warning Event, and the
    // machine stays Ready.
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(name_bmc("node-1-bmc-wrong")),
        )
        .await
        .expect("spec.bmc");
    let (observed, unreachable) = bmc_seen(&target, &name, reasons::BMC_UNAUTHORIZED).await;
    assert_eq!(
        unreachable.status,
        ichor_api::common::ConditionStatus::False
    );
    assert_eq!(observed.power_state, None, "nothing stale: {observed:?}");
    specs::events_once(&target, reasons::BMC_UNAUTHORIZED, Duration::from_secs(30))
        .await
        .expect("a Warning Event");
    let ready = specs::machine_condition(&target, &address, conditions::READY).await;
    assert!(
        ready.as_ref().is_some_and(|(holds, _, _)| *holds),
        "the machine stays Ready: {ready:?}"
    );

    // A Secret that is not there: its own reason, naming it.
    machines
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(name_bmc("absent")),
        )
        .await
        .expect("spec.bmc");
    let (_, missing) = bmc_seen(&target, &name, reasons::BMC_CREDENTIALS_MISSING).await;
    assert!(missing.message.contains("absent"), "{}", missing.message);

    // The right credentials again, trusting any certificate by the explicit opt-in: read.
    let insecure = json!({"spec": {"bmc": {
        "credentialsSecretRef": {"name": "node-1-bmc"},
        "caSecretRef": null,
        "insecureSkipVerify": true
    }}});
    machines
        .patch(&name, &PatchParams::default(), &Patch::Merge(insecure))
        .await
        .expect("spec.bmc");
    let (observed, _) = bmc_seen(&target, &name, reasons::BMC_OBSERVED).await;
    assert_eq!(observed.power_state.as_deref(), Some("On"));
    // The secret scan of `down` looks for both passwords in the logs, Events and statuses.
    target.down().await;
}
