//! The real talosctl (v1.14.1, built from Go modules by `cargo xtask oracles`) drives simulated
//! nodes through Talos's getting-started flow: what a person with talosctl sees must be a
//! Talos node. Each test uses loopback addresses of its own at port 50000, since talosctl
//! always dials a node's port 50000 (talos-facts §2 "Routing to nodes").

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Output;
use std::time::Duration;

use ichor_sim::{Hardware, NodeSpec, SimFactory, SimNode, Stage};
use ichor_testenv::nets::{SIM_TALOSCTL, SIM_TALOSCTL_VERSIONS};
use tokio::io::{AsyncBufReadExt as _, BufReader};
use tokio::process::Command;

/// How long one talosctl call may take (its own `--wait` included).
const CALL_LIMIT: Duration = Duration::from_secs(120);

/// The talosctl binary `cargo xtask oracles` builds.
fn talosctl_binary() -> PathBuf {
    let path = ichor_testenv::assets::oracles_dir().join("talosctl");
    assert!(
        path.is_file(),
        "{} is missing: run `cargo xtask oracles` (or `cargo xtask test`) to build talosctl",
        path.display()
    );
    path
}

/// talosctl with a home and a talosconfig of its own.
struct Talosctl {
    binary: PathBuf,
    dir: tempfile::TempDir,
}

impl Talosctl {
    fn new() -> Self {
        Self {
            binary: talosctl_binary(),
            dir: tempfile::tempdir().expect("a temporary folder"),
        }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    async fn run(&self, args: &[&str]) -> Output {
        let mut cmd = Command::new(&self.binary);
        cmd.args(args)
            .env_clear()
            .env("HOME", self.dir.path())
            .env("TALOSCONFIG", self.path("talosconfig"))
            .kill_on_drop(true);
        tokio::time::timeout(CALL_LIMIT, cmd.output())
            .await
            .unwrap_or_else(|_| {
                panic!(
                    "talosctl {} did not finish in {CALL_LIMIT:?}",
                    args.join(" ")
                )
            })
            .expect("run talosctl")
    }

    /// Runs a call that must succeed; returns what it printed, standard output then standard
    /// error (talosctl prints apply results and progress on standard error).
    async fn ok(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            out.status.success(),
            "talosctl {} failed ({}):\n{}\n{}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        printed(&out)
    }

    /// Runs a call that must fail; returns its standard error.
    async fn fails(&self, args: &[&str]) -> String {
        let out = self.run(args).await;
        assert!(
            !out.status.success(),
            "talosctl {} succeeded but must fail:\n{}",
            args.join(" "),
            String::from_utf8_lossy(&out.stdout)
        );
        String::from_utf8_lossy(&out.stderr).into_owned()
    }

    /// Repeats a call until it succeeds (a node coming up), at most `limit`.
    async fn ok_within(&self, limit: Duration, args: &[&str]) -> String {
        self.ok_when(limit, args, |_| true).await
    }

    /// Repeats a call until it succeeds and what it prints satisfies `done`, at most `limit`.
    async fn ok_when(&self, limit: Duration, args: &[&str], done: impl Fn(&str) -> bool) -> String {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let out = self.run(args).await;
            let text = printed(&out);
            if out.status.success() && done(&text) {
                return text;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "talosctl {} has not printed what was expected after {limit:?}:\n{text}",
                args.join(" "),
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// Standard output, then standard error.
fn printed(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

/// A node in maintenance mode on `ip`, port 50000, with a `vda` disk.
async fn node(ip: &str, seed: u32) -> SimNode {
    let addr: SocketAddr = format!("{ip}:50000").parse().expect("address");
    SimNode::start_with(addr, "v1.14.1", Hardware::vm(seed))
        .await
        .expect("a simulated node")
}

fn file(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write a file");
    path.to_string_lossy().into_owned()
}

#[tokio::test]
async fn maintenance_mode_is_inspected_with_and_without_the_pinned_fingerprint() {
    let ip = &SIM_TALOSCTL.ip(0, 1).to_string();
    let sim = node(ip, 9701).await;
    let talosctl = Talosctl::new();
    let node_args = ["-e", ip, "-n", ip];
    let with =
        |rest: &[&'static str]| -> Vec<&str> { [&node_args[..], rest, &["--insecure"]].concat() };

    let version = talosctl.ok(&with(&["version"])).await;
    let server = version.split("Server:").nth(1).expect("a server section");
    assert!(server.contains("Tag:         v1.14.1"), "{version}");
    assert!(server.contains("OS/Arch:     linux/amd64"), "{version}");
    assert!(!server.contains("Go version:  \n"), "{version}");

    let disks = talosctl.ok(&with(&["get", "disks"])).await;
    assert!(disks.contains("vda"), "{disks}");
    let info = talosctl.ok(&with(&["get", "systeminformation"])).await;
    assert!(info.contains(&sim.hardware().uuid), "{info}");
    let definitions = talosctl.ok(&with(&["get", "rd"])).await;
    assert!(
        definitions.contains("disks.block.talos.dev"),
        "{definitions}"
    );

    // `get -w` watches (talos-facts §13.2, §13.7): the disks arrive as the initial contents.
    let mut watch = Command::new(&talosctl.binary)
        .args(with(&["get", "disks", "-w"]))
        .env_clear()
        .env("HOME", talosctl.dir.path())
        .stdout(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .expect("talosctl get disks -w");
    let mut lines = BufReader::new(watch.stdout.take().expect("stdout")).lines();
    let seen = tokio::time::timeout(CALL_LIMIT, async {
        while let Ok(Some(line)) = lines.next_line().await {
            if line.contains("vda") {
                return line;
            }
        }
        panic!("the watch ended without vda");
    })
    .await
    .expect("the watch lists vda");
    assert!(seen.contains("Disk"), "{seen}");
    watch.kill().await.expect("stop the watch");

    let fingerprint = sim.fingerprint();
    let mut pinned_args = with(&["get", "disks"]);
    pinned_args.extend(["--cert-fingerprint", fingerprint.as_str()]);
    let pinned = talosctl.ok(&pinned_args).await;
    assert!(pinned.contains("vda"), "{pinned}");
    let wrong = "ImKkCmgRMs9vNl1KMcy6K6f7BtnLJG2oG9m3eKmkcNk=";
    let mut wrong_args = with(&["get", "disks"]);
    wrong_args.extend(["--cert-fingerprint", wrong]);
    let refused = talosctl.fails(&wrong_args).await;
    assert!(
        refused.contains("doesn't match the provided fingerprints"),
        "{refused}"
    );
    sim.stop().await;
}

#[tokio::test]
async fn a_config_talos_refuses_leaves_the_node_in_maintenance() {
    let ip = &SIM_TALOSCTL.ip(0, 11).to_string();
    let sim = node(ip, 9711).await;
    let fingerprint = sim.fingerprint();
    let talosctl = Talosctl::new();
    let bad = file(
        talosctl.dir.path(),
        "bad.yaml",
        "version: v1alpha1\nmachine:\n  type: controlplane\n",
    );
    let refused = talosctl
        .fails(&["apply-config", "--insecure", "-n", ip, "--file", &bad])
        .await;
    assert!(refused.contains("InvalidArgument"), "{refused}");
    assert_eq!(sim.stage().await, Stage::Maintenance);
    assert_eq!(sim.fingerprint(), fingerprint);
    let disks = talosctl
        .ok(&["-e", ip, "-n", ip, "get", "disks", "--insecure"])
        .await;
    assert!(disks.contains("vda"), "{disks}");
    sim.stop().await;
}

#[tokio::test]
async fn apply_config_dry_run_changes_nothing() {
    let ip = &SIM_TALOSCTL.ip(0, 21).to_string();
    let sim = node(ip, 9721).await;
    let fingerprint = sim.fingerprint();
    let talosctl = Talosctl::new();
    let out = talosctl.path("config").to_string_lossy().into_owned();
    talosctl
        .ok(&[
            "gen",
            "config",
            "dry",
            &format!("https://{ip}:6443"),
            "--install-disk",
            "/dev/vda",
            "--output-dir",
            &out,
        ])
        .await;
    let config = format!("{out}/controlplane.yaml");
    let summary = talosctl
        .ok(&[
            "apply-config",
            "--insecure",
            "-n",
            ip,
            "--file",
            &config,
            "--dry-run",
        ])
        .await;
    assert!(summary.contains("Dry run summary"), "{summary}");
    assert_eq!(sim.stage().await, Stage::Maintenance);
    assert_eq!(sim.fingerprint(), fingerprint);
    assert!(!sim.installed().await);
    sim.stop().await;
}

/// Talos's getting-started flow: generate a config, apply it in maintenance mode, bootstrap,
/// join a worker, then the day-2 calls with their default `--wait`.
#[tokio::test]
async fn the_getting_started_flow_works_with_talosctl() {
    let (cp_ip, worker_ip) = (
        &SIM_TALOSCTL.ip(0, 31).to_string(),
        &SIM_TALOSCTL.ip(0, 32).to_string(),
    );
    let cp = node(cp_ip, 9731).await;
    let worker = node(worker_ip, 9732).await;
    let talosctl = Talosctl::new();
    let out = talosctl.dir.path().to_string_lossy().into_owned();

    talosctl
        .ok(&[
            "gen",
            "config",
            "flow",
            &format!("https://{cp_ip}:6443"),
            "--install-disk",
            "/dev/vda",
            "--output-dir",
            &out,
        ])
        .await;
    talosctl.ok(&["config", "endpoint", cp_ip]).await;
    talosctl.ok(&["config", "node", cp_ip]).await;

    let cp_config = format!("{out}/controlplane.yaml");
    talosctl
        .ok(&[
            "apply-config",
            "--insecure",
            "-n",
            cp_ip,
            "--file",
            &cp_config,
        ])
        .await;
    let version = talosctl
        .ok_within(Duration::from_secs(30), &["version"])
        .await;
    assert!(version.contains("Tag:         v1.14.1"), "{version}");
    // The configured API answers while the installer still runs (the maintenance service is
    // gone once the config is complete); the install then finishes and the node reboots.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !cp.installed().await {
        assert!(tokio::time::Instant::now() < deadline, "never installed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }

    // Right after boot Talos answers "bootstrap is not available yet" (talos-facts §5): a
    // person runs it again, and so does this test.
    talosctl
        .ok_within(Duration::from_secs(30), &["bootstrap"])
        .await;
    let members = talosctl
        .ok_within(Duration::from_secs(30), &["etcd", "members"])
        .await;
    assert!(members.contains(&cp.hostname().await), "{members}");

    let worker_config = format!("{out}/worker.yaml");
    talosctl
        .ok(&[
            "apply-config",
            "--insecure",
            "-n",
            worker_ip,
            "--file",
            &worker_config,
        ])
        .await;
    let joined = talosctl
        .ok_within(Duration::from_secs(30), &["-n", worker_ip, "version"])
        .await;
    assert!(joined.contains("Tag:         v1.14.1"), "{joined}");
    // It answers while it still installs (stage booting on 1.14), then runs.
    talosctl
        .ok_when(
            Duration::from_secs(30),
            &["-n", worker_ip, "get", "machinestatus"],
            |status| status.contains("running"),
        )
        .await;
    // Both nodes are cluster members (discovery, talos-facts §13.6).
    let (cp_name, worker_name) = (cp.hostname().await, worker.hostname().await);
    talosctl
        .ok_when(Duration::from_secs(30), &["get", "members"], |members| {
            members.contains(&cp_name) && members.contains(&worker_name)
        })
        .await;

    // A snapshot talosctl accepts: etcdutl's status, which it runs on the file, counts the
    // keys the simulated keyspace holds (talos-facts §12.1).
    let snapshot = format!("{out}/etcd.snapshot");
    let saved = talosctl
        .ok(&["-n", cp_ip, "etcd", "snapshot", &snapshot])
        .await;
    let keys = cp.etcd_keys().await.expect("a keyspace");
    assert!(
        saved.contains(&format!("total keys {keys},")),
        "{saved}\nexpected total keys {keys}"
    );
    assert!(std::fs::metadata(&snapshot).expect("the snapshot").len() > 1024 * 1024);

    // Day 2, each with talosctl's default --wait.
    talosctl.ok(&["-n", cp_ip, "reboot"]).await;
    assert_eq!(cp.stage().await, Stage::Running);
    let services = talosctl.ok(&["-n", cp_ip, "services"]).await;
    assert!(services.contains("etcd"), "{services}");

    talosctl
        .ok(&[
            "-n",
            cp_ip,
            "upgrade",
            "--drain=false",
            "--image",
            "ghcr.io/siderolabs/installer:v1.14.1",
        ])
        .await;
    let upgraded = talosctl.ok(&["-n", cp_ip, "version"]).await;
    assert!(upgraded.contains("Tag:         v1.14.1"), "{upgraded}");

    // reset's defaults: graceful, then power off (no --reboot).
    talosctl.ok(&["-n", worker_ip, "reset"]).await;
    assert!(!worker.is_serving().await);

    worker.stop().await;
    cp.stop().await;
}

/// A control plane of a cluster of its own, configured and installed with talosctl, whose
/// talosconfig is `talosctl`'s.
async fn installed_control_plane(talosctl: &Talosctl, ip: &str, seed: u32, name: &str) -> SimNode {
    let sim = node(ip, seed).await;
    install_control_plane(talosctl, &sim, ip, name).await;
    sim
}

/// Configures and installs `sim`, on `ip`, as a control plane of a cluster of its own with
/// talosctl.
async fn install_control_plane(talosctl: &Talosctl, sim: &SimNode, ip: &str, name: &str) {
    let out = talosctl.dir.path().to_string_lossy().into_owned();
    talosctl
        .ok(&[
            "gen",
            "config",
            name,
            &format!("https://{ip}:6443"),
            "--install-disk",
            "/dev/vda",
            "--output-dir",
            &out,
        ])
        .await;
    talosctl.ok(&["config", "endpoint", ip]).await;
    talosctl.ok(&["config", "node", ip]).await;
    let config = format!("{out}/controlplane.yaml");
    talosctl
        .ok(&["apply-config", "--insecure", "-n", ip, "--file", &config])
        .await;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while !sim.installed().await {
        assert!(tokio::time::Instant::now() < deadline, "never installed");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    talosctl
        .ok_within(Duration::from_secs(30), &["version"])
        .await;
}

/// `talosctl bootstrap --recover-from` (`crates/ichor-sim/docs/etcd-recovery.md`): talosctl
/// reads the snapshot another cluster saved with etcdutl, uploads it and bootstraps from it;
/// the keys written before the snapshot are back, with one member; a second bootstrap is
/// refused.
#[tokio::test]
async fn talosctl_recovers_etcd_from_another_clusters_snapshot() {
    let (source_ip, target_ip) = (
        &SIM_TALOSCTL.ip(0, 51).to_string(),
        &SIM_TALOSCTL.ip(0, 52).to_string(),
    );
    let first = Talosctl::new();
    let source = installed_control_plane(&first, source_ip, 9751, "first").await;
    first
        .ok_within(Duration::from_secs(30), &["bootstrap"])
        .await;
    first
        .ok_within(Duration::from_secs(30), &["etcd", "members"])
        .await;
    source
        .etcd_put("/ichor/test/recovered", "from the first cluster")
        .await
        .expect("put");
    let snapshot = first.path("etcd.snapshot").to_string_lossy().into_owned();
    first.ok(&["etcd", "snapshot", &snapshot]).await;
    let keys = source.etcd_keys().await.expect("a keyspace");

    let second = Talosctl::new();
    let target = installed_control_plane(&second, target_ip, 9752, "second").await;
    let recovered = second
        .ok_within(
            Duration::from_secs(30),
            &["bootstrap", "--recover-from", &snapshot],
        )
        .await;
    assert!(
        recovered.contains(&format!("total keys {keys},")),
        "talosctl's own etcdutl status of the file:\n{recovered}"
    );
    let members = second
        .ok_within(Duration::from_secs(30), &["etcd", "members"])
        .await;
    let hostname = target.hostname().await;
    assert!(members.contains(&hostname), "{members}");
    assert!(
        !members.contains(&source.hostname().await),
        "the snapshot's membership is dropped:\n{members}"
    );
    assert_eq!(
        members.lines().filter(|l| l.contains(&hostname)).count(),
        1,
        "{members}"
    );
    assert_eq!(
        target.etcd_get("/ichor/test/recovered").await.expect("get"),
        Some(b"from the first cluster".to_vec())
    );
    assert_eq!(target.etcd_keys().await, Some(keys));
    let refused = second
        .fails(&["bootstrap", "--recover-from", &snapshot])
        .await;
    assert!(
        refused.contains("etcd data directory is not empty"),
        "{refused}"
    );
    target.stop().await;
    source.stop().await;
}

/// An install disk the machine does not have: Talos accepts the config (the path is not checked
/// at apply time), and 1.14's unattended install stays pending, saying why (talos-facts §11.5,
/// §11.7); the node never installs.
#[tokio::test]
async fn an_install_disk_the_machine_lacks_leaves_the_install_pending() {
    let ip = &SIM_TALOSCTL.ip(0, 41).to_string();
    let sim = node(ip, 9741).await;
    let talosctl = Talosctl::new();
    let out = talosctl.dir.path().to_string_lossy().into_owned();
    talosctl
        .ok(&[
            "gen",
            "config",
            "nodisk",
            &format!("https://{ip}:6443"),
            "--install-disk",
            "/dev/sda",
            "--output-dir",
            &out,
        ])
        .await;
    let config = format!("{out}/controlplane.yaml");
    talosctl
        .ok(&["apply-config", "--insecure", "-n", ip, "--file", &config])
        .await;
    talosctl.ok(&["config", "endpoint", ip]).await;
    talosctl.ok(&["config", "node", ip]).await;
    let status = talosctl
        .ok_within(
            Duration::from_secs(30),
            &["get", "unattendedinstallstatus", "-o", "yaml"],
        )
        .await;
    assert!(status.contains("no disk matched the selector"), "{status}");
    assert_eq!(
        sim.unattended_install().await,
        Some(("pending", "no disk matched the selector".to_owned()))
    );
    assert!(!sim.installed().await);
    let refused = talosctl.fails(&["bootstrap"]).await;
    assert!(
        refused.contains("bootstrap is not available yet"),
        "{refused}"
    );
    sim.stop().await;
}

/// User volumes as talosctl shows them (`crates/ichor-sim/docs/user-volumes.md`): a config
/// with `UserVolumeConfig` documents, applied with talosctl, gives one `VolumeStatus` per
/// document once the node is installed: `u-data` ready on the second disk, `u-nowhere` failed
/// with Talos's error; on 1.13 and 1.14.
#[tokio::test]
async fn talosctl_gets_the_user_volumes() {
    for (ip, version, contract, seed) in [
        (SIM_TALOSCTL_VERSIONS.ip(0, 1), "v1.13.9", "v1.13", 17301),
        (SIM_TALOSCTL_VERSIONS.ip(0, 2), "v1.14.1", "v1.14", 17302),
    ] {
        let mut hardware = Hardware::vm(seed);
        hardware.disks.push(ichor_sim::SimDisk {
            name: "vdb".into(),
            size: 50_000_000_000,
            cdrom: false,
            transport: "virtio".into(),
            model: String::new(),
            serial: format!("SIMB{seed}"),
        });
        let addr = SocketAddr::from((ip, 50000));
        let ip = &ip.to_string();
        let sim = SimNode::start_with(addr, version, hardware)
            .await
            .expect("a simulated node");
        let talosctl = Talosctl::new();
        let out = talosctl.dir.path().to_string_lossy().into_owned();
        talosctl
            .ok(&[
                "gen",
                "config",
                "volumes",
                &format!("https://{ip}:6443"),
                "--install-disk",
                "/dev/vda",
                "--talos-version",
                contract,
                // The newest Kubernetes both releases run.
                "--kubernetes-version",
                "1.36.3",
                "--output-dir",
                &out,
            ])
            .await;
        let generated =
            std::fs::read_to_string(format!("{out}/controlplane.yaml")).expect("the config");
        let config = file(
            talosctl.dir.path(),
            "with-volumes.yaml",
            &format!(
                "{}\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: data\nprovisioning:\n  diskSelector:\n    match: disk.dev_path == '/dev/vdb'\n  minSize: 1GiB\n  maxSize: 10GiB\n---\napiVersion: v1alpha1\nkind: UserVolumeConfig\nname: nowhere\nprovisioning:\n  diskSelector:\n    match: disk.size > 10u * TB\n  minSize: 1GiB\n",
                generated.trim_end()
            ),
        );
        talosctl
            .ok(&["apply-config", "--insecure", "-n", ip, "--file", &config])
            .await;
        talosctl.ok(&["config", "endpoint", ip]).await;
        talosctl.ok(&["config", "node", ip]).await;
        let table = talosctl
            .ok_when(
                Duration::from_secs(60),
                &["get", "volumestatus", "u-data"],
                |t| t.contains("ready"),
            )
            .await;
        let row = table
            .lines()
            .find(|l| l.contains("u-data"))
            .unwrap_or_else(|| panic!("{version}: no u-data row in\n{table}"));
        let columns: Vec<&str> = row.split_whitespace().collect();
        for column in ["VolumeStatus", "u-data", "partition", "ready", "/dev/vdb1"] {
            assert!(columns.contains(&column), "{version}: {column} in {row}");
        }
        assert!(
            row.ends_with("11 GB"),
            "{version}: the size column\n{table}"
        );
        let failed = talosctl
            .ok(&["get", "volumestatus", "u-nowhere", "-o", "yaml"])
            .await;
        for line in [
            "    phase: failed",
            "    type: partition",
            "    errorMessage: no disks matched selector for volume",
            "        targetPath: nowhere",
            "        parentId: /var/mnt",
            "        talos.dev/user-volume:",
        ] {
            assert!(
                failed.lines().any(|l| l == line),
                "{version}: no `{line}` in\n{failed}"
            );
        }
        sim.stop().await;
    }
}

/// The rows of `talosctl get extensions` (talos-facts §9.5: `NODE NAMESPACE TYPE ID VERSION
/// NAME VERSION`, the last two the manifest's name and version): (NAME, VERSION) per row.
fn extension_rows(table: &str) -> Vec<(String, String)> {
    let mut lines = table.lines().filter(|l| !l.trim().is_empty());
    let header: Vec<&str> = lines
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(
        header,
        [
            "NODE",
            "NAMESPACE",
            "TYPE",
            "ID",
            "VERSION",
            "NAME",
            "VERSION"
        ],
        "{table}"
    );
    lines
        .map(|row| {
            let columns: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(columns.len(), 7, "{row}");
            assert_eq!(
                (columns[1], columns[2]),
                ("runtime", "ExtensionStatus"),
                "{row}"
            );
            (columns[5].to_owned(), columns[6].to_owned())
        })
        .collect()
}

/// `talosctl get extensions` on a node upgraded with an Image Factory installer (talos-facts
/// §9.4, §9.5): talosctl's upgrade pulls the image first, which fails for a schematic the
/// factory does not know; with a known one, after the reboot the node lists the schematic's
/// official extensions and the factory's `schematic` extension, whose version is the ID, and
/// 1.14 surfaces the ID as its `ImageFactorySchematic`.
#[tokio::test]
async fn talosctl_gets_the_extensions_of_the_factory_installer_a_node_was_upgraded_with() {
    let ip = &SIM_TALOSCTL.ip(0, 61).to_string();
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    let sim = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(9761),
        factory: factory.clone(),
        ..NodeSpec::new(format!("{ip}:50000").parse().expect("address"), "v1.14.1")
    })
    .await
    .expect("a simulated node");
    let talosctl = Talosctl::new();
    install_control_plane(&talosctl, &sim, ip, "extensions").await;
    // talosctl's upgrade waits for the node to boot again, a control plane's etcd included.
    talosctl
        .ok_within(Duration::from_secs(30), &["bootstrap"])
        .await;
    let registry = factory.addr().expect("address");

    let unknown = format!("{registry}/metal-installer/{}:v1.14.2", "0".repeat(64));
    let refused = talosctl
        .fails(&["upgrade", "--drain=false", "--image", &unknown])
        .await;
    assert!(
        refused.contains(&format!("failed to resolve reference \"{unknown}\"")),
        "{refused}"
    );

    let schematic = ichor_api::schematic::Schematic {
        system_extensions: vec!["siderolabs/gvisor".into(), "siderolabs/intel-ucode".into()],
        ..Default::default()
    };
    let id = factory.register(&schematic).expect("a schematic");
    assert_eq!(id, ichor_render::schematic::id(&schematic).expect("its ID"));
    let image = format!("{registry}/metal-installer/{id}:v1.14.2");
    talosctl
        .ok(&["upgrade", "--drain=false", "--image", &image])
        .await;
    let version = talosctl.ok(&["version"]).await;
    assert!(version.contains("Tag:         v1.14.2"), "{version}");

    let table = talosctl.ok(&["get", "extensions"]).await;
    assert_eq!(
        extension_rows(&table),
        [
            ("gvisor".to_owned(), "v1.14.2".to_owned()),
            ("intel-ucode".to_owned(), "v1.14.2".to_owned()),
            ("schematic".to_owned(), id.clone()),
        ],
        "{table}"
    );
    let surfaced = talosctl.ok(&["get", "imagefactoryschematic"]).await;
    let row = surfaced
        .lines()
        .find(|l| l.contains("image-factory-schematic"))
        .unwrap_or_else(|| panic!("no ImageFactorySchematic row in\n{surfaced}"));
    assert!(
        row.contains(&id) && row.contains("Image Factory") && row.contains(&factory.url()),
        "{row}"
    );
    sim.stop().await;
}

/// The `(ID, READY)` rows of `talosctl get staticpodstatus` (talos-facts §14.1: `NODE
/// NAMESPACE TYPE ID VERSION READY`, READY the pod's `Ready` condition).
fn static_pod_rows(table: &str) -> Vec<(String, String)> {
    table
        .lines()
        .filter(|l| l.split_whitespace().nth(2) == Some("StaticPodStatus"))
        .map(|row| {
            let columns: Vec<&str> = row.split_whitespace().collect();
            assert_eq!(columns.len(), 6, "{row}");
            assert_eq!(columns[1], "k8s", "{row}");
            (columns[3].to_owned(), columns[5].to_owned())
        })
        .collect()
}

/// `talosctl get staticpodstatus` and `talosctl get manifests` on a control plane talosctl
/// configured and bootstrapped (talos-facts §14): one ready status per control-plane static
/// pod, the kubelet's PodStatus as its YAML; the bootstrap manifests with kube-proxy's
/// DaemonSet. A patch of the API server's image reaches its pod.
#[tokio::test]
async fn talosctl_gets_the_static_pod_statuses_and_manifests() {
    let ip = &SIM_TALOSCTL.ip(0, 71).to_string();
    let talosctl = Talosctl::new();
    let sim = installed_control_plane(&talosctl, ip, 9771, "kubernetes").await;
    talosctl
        .ok_within(Duration::from_secs(30), &["bootstrap"])
        .await;
    let host = sim.hostname().await.to_lowercase();
    let ready = |table: &str| {
        let rows = static_pod_rows(table);
        rows.len() == 3 && rows.iter().all(|(_, ready)| ready == "True")
    };
    let table = talosctl
        .ok_when(Duration::from_secs(30), &["get", "staticpodstatus"], ready)
        .await;
    let ids: Vec<String> = static_pod_rows(&table).into_iter().map(|r| r.0).collect();
    assert_eq!(
        ids,
        [
            "kube-apiserver",
            "kube-controller-manager",
            "kube-scheduler"
        ]
        .map(|pod| format!("kube-system/{pod}-{host}")),
        "{table}"
    );
    let api_server = format!("kube-system/kube-apiserver-{host}");
    let yaml = talosctl
        .ok(&["get", "staticpodstatus", &api_server, "-o", "yaml"])
        .await;
    for line in [
        "    phase: Running",
        "          image: registry.k8s.io/kube-apiserver:v1.37.0",
        "          type: Ready",
    ] {
        assert!(yaml.lines().any(|l| l == line), "no `{line}` in\n{yaml}");
    }

    let manifests = talosctl.ok(&["get", "manifests"]).await;
    for id in ["10-kube-proxy", "11-core-dns", "11-core-dns-svc"] {
        assert!(
            manifests
                .lines()
                .any(|l| l.split_whitespace().nth(3) == Some(id)),
            "no manifest {id} in\n{manifests}"
        );
    }
    let proxy = talosctl
        .ok(&["get", "manifests", "10-kube-proxy", "-o", "yaml"])
        .await;
    assert!(
        proxy.contains("image: registry.k8s.io/kube-proxy:v1.37.0")
            && proxy.contains("kind: DaemonSet"),
        "{proxy}"
    );

    let patch = talosctl.path("apiserver.yaml");
    std::fs::write(
        &patch,
        "apiVersion: v1alpha1\nkind: KubeAPIServerConfig\nimage: registry.k8s.io/kube-apiserver:v1.37.1\n",
    )
    .expect("write the patch");
    talosctl
        .ok(&[
            "patch",
            "machineconfig",
            "--mode",
            "no-reboot",
            "--patch",
            &format!("@{}", patch.display()),
        ])
        .await;
    talosctl
        .ok_when(
            Duration::from_secs(30),
            &["get", "staticpodstatus", &api_server, "-o", "yaml"],
            |yaml| {
                yaml.contains("image: registry.k8s.io/kube-apiserver:v1.37.1")
                    && yaml.contains("ready: true")
            },
        )
        .await;
    sim.stop().await;
}
