//! Published credentials on the sim target (ADR 0022): with a 30 s lifetime, the kubeconfig and
//! the talosconfig a cluster's status names say when they expire (what status says is what
//! their certificates hold), are kept rather than minted on every reconcile, are renewed before
//! they do,
//! and the renewed files keep working with the real `kubectl` and the real `talosctl`, while
//! the first ones stop working once expired. A changed `spec.endpoint` re-mints the kubeconfig
//! at once.
//!
//! `kubectl` is `ICHOR_KUBECTL` or the one built from `tools/k8s` (in `KUBEBUILDER_ASSETS`);
//! `talosctl` is the one `cargo xtask oracles` builds (`ICHOR_ORACLES_DIR`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use ichor_api::TalosCluster;
use ichor_api::names::{reasons, secrets};
use ichor_harness::specs;
use ichor_harness::{SimOptions, SimTarget, Target};
use ichor_testenv::nets::CREDENTIALS;
use ichor_testenv::wait::try_eventually;
use k8s_openapi::api::core::v1::Secret;
use k8s_openapi::jiff::Timestamp;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

const CLUSTER: &str = "lab";
/// The published credentials' lifetime: renewed 20 s after they are minted.
const LIFETIME: Duration = Duration::from_secs(30);

/// The `kubectl` binary: `ICHOR_KUBECTL`, else the one `cargo xtask envtest-assets` builds
/// from `tools/k8s` beside kube-apiserver (`KUBEBUILDER_ASSETS`).
fn kubectl() -> PathBuf {
    if let Some(path) = std::env::var_os("ICHOR_KUBECTL") {
        return PathBuf::from(path);
    }
    let path = std::env::var_os("KUBEBUILDER_ASSETS")
        .map(|dir| PathBuf::from(dir).join("kubectl"))
        .expect("KUBEBUILDER_ASSETS is not set: run through `cargo xtask`, or set ICHOR_KUBECTL");
    assert!(
        path.is_file(),
        "{} is missing: `cargo xtask envtest-assets` builds it from tools/k8s",
        path.display()
    );
    path
}

/// The `talosctl` binary `cargo xtask oracles` builds.
fn talosctl() -> PathBuf {
    let path = ichor_testenv::assets::oracles_dir().join("talosctl");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask oracles` to build talosctl",
        path.display()
    );
    path
}

/// Runs `program` with `args` and a home of its own; whether it succeeded, and what it printed.
async fn run(program: &Path, home: &Path, args: &[&str]) -> (bool, String) {
    let mut command = tokio::process::Command::new(program);
    command
        .args(args)
        .env_clear()
        .env("HOME", home)
        .env("PATH", std::env::var_os("PATH").unwrap_or_default())
        .kill_on_drop(true);
    let output = tokio::time::timeout(Duration::from_secs(60), command.output())
        .await
        .unwrap_or_else(|_| panic!("{} {args:?} did not finish in 60 s", program.display()))
        .expect("run it");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    (output.status.success(), printed)
}

/// When the published kubeconfig and talosconfig expire, as the cluster's status says.
async fn expiries(target: &SimTarget) -> (Option<Timestamp>, Option<Timestamp>) {
    let cluster = Api::<TalosCluster>::namespaced(target.client(), target.namespace())
        .get(CLUSTER)
        .await
        .expect("the cluster");
    let credentials = cluster
        .status
        .and_then(|s| s.core.credentials)
        .unwrap_or_default();
    (
        credentials.kubeconfig_expires_at.map(|t| t.0),
        credentials.talosconfig_expires_at.map(|t| t.0),
    )
}

/// Writes the published file `key` of Secret `name` to `dir/file`; returns its path and text.
async fn published(target: &SimTarget, name: &str, key: &str, file: &str) -> (PathBuf, String) {
    let secret = Api::<Secret>::namespaced(target.client(), target.namespace())
        .get(name)
        .await
        .expect("the published Secret");
    let bytes = secret
        .data
        .and_then(|d| d.get(key).cloned())
        .unwrap_or_else(|| panic!("{name} has no {key}"));
    let path = target.dir().join(file);
    std::fs::write(&path, &bytes.0).expect("write the file");
    (path, String::from_utf8_lossy(&bytes.0).into_owned())
}

/// Both files as published now, written under `suffix`.
async fn files(target: &SimTarget, suffix: &str) -> (PathBuf, PathBuf) {
    let kubeconfig = format!("{CLUSTER}-kubeconfig");
    let talosconfig = format!("{CLUSTER}-talosconfig");
    let (kube, _) = published(
        target,
        &kubeconfig,
        secrets::KUBECONFIG_KEY,
        &format!("kubeconfig-{suffix}"),
    )
    .await;
    let (talos, _) = published(
        target,
        &talosconfig,
        secrets::TALOSCONFIG_KEY,
        &format!("talosconfig-{suffix}"),
    )
    .await;
    (kube, talos)
}

/// When the certificates in the kubeconfig and talosconfig files expire.
fn file_expiries((kube, talos): &(PathBuf, PathBuf)) -> (Option<Timestamp>, Option<Timestamp>) {
    let read = |path: &PathBuf| std::fs::read_to_string(path).expect("read the file");
    let at = |p: Option<ichor_render::credentials::Published>| {
        p.and_then(|p| Timestamp::try_from(p.not_after).ok())
    };
    (
        at(ichor_render::credentials::read_kubeconfig(&read(kube))),
        at(ichor_render::credentials::read_talosconfig(
            &read(talos),
            CLUSTER,
        )),
    )
}

/// `kubectl get nodes` and `talosctl version` with the files: whether each succeeded.
async fn clients_with(
    target: &SimTarget,
    (kube, talos): &(PathBuf, PathBuf),
) -> [(bool, String); 2] {
    let home = target.dir();
    let kube = kube.to_string_lossy().into_owned();
    let talos = talos.to_string_lossy().into_owned();
    [
        run(
            &kubectl(),
            home,
            &["--kubeconfig", &kube, "get", "nodes", "-o", "name"],
        )
        .await,
        run(&talosctl(), home, &["--talosconfig", &talos, "version"]).await,
    ]
}

async fn renewal_events(target: &SimTarget) -> Vec<String> {
    specs::events_with_reason(target, reasons::CREDENTIALS_RENEWED)
        .await
        .into_iter()
        .filter_map(|e| e.note)
        .collect()
}

fn later(a: Option<Timestamp>, b: Option<Timestamp>) -> bool {
    matches!((a, b), (Some(a), Some(b)) if a > b)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn published_credentials_are_renewed_before_they_expire_and_keep_working() {
    let target = SimTarget::up(SimOptions {
        manager_args: vec![
            "--credential-lifetime".into(),
            format!("{}s", LIFETIME.as_secs()),
        ],
        ..SimOptions::new(1, CREDENTIALS.net(0), "v1.14.1")
    })
    .await
    .expect("sim target");
    specs::discovered_cluster(&target, "v1.14.1", 1, 1)
        .await
        .expect("cluster discovered");
    specs::approve_shape(&target, 1, 0).await.expect("approve");
    if let Err(error) = specs::wait_ready(&target, CLUSTER, Duration::from_secs(180)).await {
        panic!("{error}: {}", specs::summary(&target).await);
    }
    target
        .kubelets_registered(CLUSTER)
        .await
        .expect("Nodes registered");

    // Status says when each expires: within the lifetime from now.
    let first = expiries(&target).await;
    let now = Timestamp::now();
    for expiry in [first.0, first.1] {
        let expiry = expiry.expect("an expiry in status");
        let left = expiry.duration_since(now);
        assert!(
            left.as_secs() > 0 && left.as_secs() <= LIFETIME.as_secs() as i64,
            "expires at {expiry}, {left:?} from now"
        );
    }
    // Kept, not minted on every reconcile: over 3 s at most one renewal is seen. The sleep is
    // the measurement (a rate: renewals in a window of reconciles), not a wait for a signal.
    let mut seen = vec![first];
    for _ in 0..12 {
        tokio::time::sleep(Duration::from_millis(250)).await;
        let now = expiries(&target).await;
        if seen.last() != Some(&now) {
            seen.push(now);
        }
    }
    assert!(seen.len() <= 2, "minted again and again: {seen:?}");
    let first = *seen.last().expect("seen");
    let first_files = files(&target, "first").await;
    // What status says is what the files hold.
    let in_files = file_expiries(&first_files);
    assert_eq!(in_files, first, "the files' certificates against status");
    for (ok, printed) in clients_with(&target, &first_files).await {
        assert!(ok, "the first files work: {printed}");
    }

    // Renewed before they expire: each file's expiry moves on while its first one still holds.
    // Each is judged by its own: the two were minted at different times (the talosconfig
    // before bootstrap, and again when its targets changed), so one may already have been
    // renewed within the window above while the other was not.
    let moved: std::sync::Mutex<[Option<Timestamp>; 2]> = std::sync::Mutex::new([None, None]);
    let seen_moving = &moved;
    let target_ref = &target;
    if let Err(error) = try_eventually("both renewed", LIFETIME, move || async move {
        let now = expiries(target_ref).await;
        let at = Timestamp::now();
        let mut seen = seen_moving.lock().expect("not poisoned");
        for (slot, moved_on) in seen
            .iter_mut()
            .zip([later(now.0, first.0), later(now.1, first.1)])
        {
            if moved_on && slot.is_none() {
                *slot = Some(at);
            }
        }
        seen.iter().all(Option::is_some)
    })
    .await
    {
        panic!(
            "{error}: {:?} then {:?}\nmanager log:\n{}",
            first,
            expiries(&target).await,
            target.manager_log_tail()
        );
    }
    let moved = moved.into_inner().expect("not poisoned");
    for ((name, renewed_at), expiry) in ["kubeconfig", "talosconfig"]
        .into_iter()
        .zip(moved)
        .zip([first.0, first.1])
    {
        let (Some(renewed_at), Some(expiry)) = (renewed_at, expiry) else {
            panic!("the {name}: renewed at {renewed_at:?}, first expiry {expiry:?}");
        };
        assert!(
            renewed_at < expiry,
            "the {name} renewed at {renewed_at} (seen), after the first one expired at {expiry}"
        );
    }

    // Once the first ones have expired, they no longer work; the published files do.
    let last_expiry = first.0.max(first.1).expect("expiries");
    let wait = Duration::try_from(last_expiry.duration_since(Timestamp::now())).unwrap_or_default()
        + Duration::from_secs(30);
    if let Err(error) = try_eventually("the expired files refused", wait, || async {
        let [kube, talos] = clients_with(&target, &first_files).await;
        if kube.0 || talos.0 {
            Err(format!("kubectl: {}; talosctl: {}", kube.1, talos.1))
        } else {
            Ok(())
        }
    })
    .await
    {
        panic!("{error} (they expired at {last_expiry})");
    }
    assert!(
        Timestamp::now() >= last_expiry,
        "refused before they expired at {last_expiry}"
    );
    let renewed = files(&target, "renewed").await;
    let [kube, talos] = clients_with(&target, &renewed).await;
    assert!(
        kube.0,
        "kubectl get nodes with the renewed kubeconfig: {}",
        kube.1
    );
    assert!(kube.1.contains("node/cp-1"), "{}", kube.1);
    assert!(
        talos.0,
        "talosctl version with the renewed talosconfig: {}",
        talos.1
    );
    let events = renewal_events(&target).await;
    // Repeats of one reason are counted in the first Event's series (its note stays).
    assert!(
        events.iter().any(|n| n.contains("two thirds")),
        "a CredentialsRenewed Event says why: {events:?}"
    );

    // A new endpoint re-mints the kubeconfig at once, long before it is due.
    let clusters = Api::<TalosCluster>::namespaced(target.client(), target.namespace());
    let moved = &format!("https://{}:6444", CREDENTIALS.ip(0, 1));
    clusters
        .patch(
            CLUSTER,
            &PatchParams::default(),
            &Patch::Merge(json!({"spec": {"endpoint": moved}})),
        )
        .await
        .expect("move the endpoint");
    try_eventually(
        "the kubeconfig names the new endpoint",
        Duration::from_secs(10),
        || async {
            let (_, text) = published(
                &target,
                &format!("{CLUSTER}-kubeconfig"),
                secrets::KUBECONFIG_KEY,
                "kubeconfig-moved",
            )
            .await;
            ichor_render::credentials::read_kubeconfig(&text)
                .is_some_and(|p| p.endpoints == [moved.as_str()])
        },
    )
    .await
    .expect("re-minted for the new endpoint");
    target.down().await;
}
