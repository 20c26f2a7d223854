//! The simulated Image Factory (talos-facts §9.3–§9.5): its schematic API answers as the
//! factory's does, a node's containerd finds only the installers of schematics it knows, and a
//! node's extensions are those of the installer it was installed or upgraded with.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::schematic::{MetaValue, Schematic};
use ichor_render::schematic::{self, EMPTY_ID};
use ichor_sim::{Hardware, NodeSpec, SimFactory, SimNode, Stage};
use ichor_talos::api::cosi::resource::GetRequest;
use ichor_talos::api::cosi::resource::state_client::StateClient;
use ichor_talos::{ApplyMode, Extension, TalosClient};
use ichor_testenv::nets::SIM_FACTORY;
use ichor_testenv::wait::eventually;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long the simulated node gets for what a test waits for.
const WAIT: Duration = Duration::from_secs(10);

/// An HTTP reply: status code, headers (lowercased names) and body.
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: String,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One HTTP/1.1 request to the factory.
async fn http(factory: &SimFactory, method: &str, path: &str, body: &str) -> Reply {
    let addr = factory.addr().expect("a started factory");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the factory answers");
    let request = format!(
        "{method} {path} HTTP/1.1\r\nhost: {addr}\r\ncontent-type: application/x-whatever\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
        body.len()
    );
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = String::new();
    stream.read_to_string(&mut raw).await.expect("read");
    let (head, body) = raw.split_once("\r\n\r\n").expect("a complete reply");
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    Reply {
        status,
        headers,
        body: body.to_owned(),
    }
}

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from((SIM_FACTORY.ip(0, host), 0))
}

fn gvisor_and_ucode() -> Schematic {
    Schematic {
        system_extensions: vec!["siderolabs/gvisor".into(), "siderolabs/intel-ucode".into()],
        extra_kernel_args: vec!["net.ifnames=0".into()],
        ..Schematic::default()
    }
}

/// A node installed before with `config` (a golden config), pulling from `factory`.
async fn configured(host: u8, version: &str, config: &str, factory: &SimFactory) -> SimNode {
    SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(176 * 256 + u32::from(host)),
        config: Some(config.to_owned()),
        factory: factory.clone(),
        ..NodeSpec::new(addr(host), version)
    })
    .await
    .expect("start")
}

/// The node's own message of a failed call.
fn message(error: &ichor_talos::TalosError) -> String {
    match error {
        ichor_talos::TalosError::Rpc { status, .. } => status.message().to_owned(),
        other => panic!("not a refusal by the node: {other}"),
    }
}

fn extension(name: &str, version: &str) -> Extension {
    Extension {
        name: name.into(),
        version: version.into(),
    }
}

/// 1.14's `ImageFactorySchematic` resource (its YAML spec), or the COSI error.
async fn image_factory_schematic(client: &TalosClient) -> Result<String, tonic::Status> {
    StateClient::new(client.channel())
        .get(GetRequest {
            namespace: "runtime".into(),
            r#type: "ImageFactorySchematics.runtime.talos.dev".into(),
            id: "image-factory-schematic".into(),
            options: None,
        })
        .await
        .map(|r| {
            r.into_inner()
                .resource
                .and_then(|r| r.spec)
                .map(|s| s.yaml_spec)
                .unwrap_or_default()
        })
}

#[tokio::test]
async fn the_schematic_api_answers_as_the_factory_does() {
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    assert_eq!(
        factory.url(),
        format!("http://{}", factory.addr().expect("address"))
    );
    let wanted = gvisor_and_ucode();
    let id = schematic::id(&wanted).expect("an exact ID");
    let canonical = schematic::canonical_yaml(&wanted).expect("canonical YAML");

    // YAML in any layout, the Content-Type ignored: 201 with the ID and the canonical YAML.
    let created = http(
        &factory,
        "POST",
        "/schematics",
        "customization:\n  extraKernelArgs: [net.ifnames=0]\n  systemExtensions:\n    officialExtensions:\n      - siderolabs/gvisor\n      - siderolabs/intel-ucode\n",
    )
    .await;
    assert_eq!(created.status, 201, "{}", created.body);
    assert_eq!(created.header("content-type"), Some("application/json"));
    assert!(created.body.ends_with("}\n"), "{:?}", created.body);
    let json: serde_json::Value = serde_json::from_str(&created.body).expect("json");
    assert_eq!(json["id"], id.as_str());
    assert_eq!(json["schematic"], canonical.as_str());

    // The same schematic as JSON: 201 again, the same ID (idempotent).
    let again = http(
        &factory,
        "POST",
        "/schematics",
        &serde_json::json!({"customization": {
            "extraKernelArgs": ["net.ifnames=0"],
            "systemExtensions": {"officialExtensions": ["siderolabs/gvisor", "siderolabs/intel-ucode"]},
        }})
        .to_string(),
    )
    .await;
    assert_eq!(again.status, 201, "{}", again.body);
    assert_eq!(again.body, created.body);

    let read = http(&factory, "GET", &format!("/schematics/{id}"), "").await;
    assert_eq!(read.status, 200);
    assert_eq!(read.header("content-type"), Some("application/yaml"));
    assert_eq!(read.body, canonical);
    // The default schematic is always there.
    let empty = http(&factory, "GET", &format!("/schematics/{EMPTY_ID}"), "").await;
    assert_eq!(
        (empty.status, empty.body.as_str()),
        (200, "customization: {}\n")
    );

    let missing = http(
        &factory,
        "GET",
        &format!("/schematics/{}", "0".repeat(64)),
        "",
    )
    .await;
    assert_eq!(
        (missing.status, missing.body.as_str()),
        (404, "schematic not found\n")
    );
    assert_eq!(
        missing.header("content-type"),
        Some("text/plain; charset=utf-8")
    );

    // Refusals: plain text, 400.
    let unknown = http(&factory, "POST", "/schematics", "something:").await;
    assert_eq!(
        (unknown.status, unknown.body.as_str()),
        (
            400,
            "yaml: construct errors: line 1: field something not found in type schematic.Schematic\n"
        )
    );
    let overlay = http(
        &factory,
        "POST",
        "/schematics",
        "overlay:\n  image: siderolabs/sbc-raspberrypi\n  name: rpi_generic\n",
    )
    .await;
    assert_eq!(overlay.status, 400);
    assert!(
        overlay.body.starts_with("overlay is not modelled"),
        "{}",
        overlay.body
    );
    // A schematic whose ID cannot be computed exactly: the reason the renderer gives.
    let quoted = Schematic {
        meta: vec![MetaValue {
            key: 10,
            value: "yes".into(),
        }],
        ..Schematic::default()
    };
    let uncertain = http(
        &factory,
        "POST",
        "/schematics",
        "customization:\n  meta:\n    - key: 10\n      value: 'yes'\n",
    )
    .await;
    assert_eq!(uncertain.status, 400);
    assert_eq!(
        uncertain.body,
        format!("{}\n", schematic::id(&quoted).expect_err("refused"))
    );

    assert_eq!(factory.posts(), 5);
    let mut known = vec![EMPTY_ID.to_owned(), id];
    known.sort();
    assert_eq!(factory.ids(), known);
}

#[tokio::test]
async fn an_installer_whose_schematic_the_factory_does_not_know_cannot_be_pulled() {
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    let registry = factory.addr().expect("address").to_string();
    let unknown = format!(
        "{registry}/metal-installer/{}:v1.14.2",
        schematic::id(&gvisor_and_ucode()).expect("id")
    );
    let node = configured(
        1,
        "v1.14.1",
        &support::golden("1.14-controlplane-flannel-plain.yaml"),
        &factory,
    )
    .await;
    let client = support::admin("bundle-1.14.yaml", &node).await;
    let refused = client.pull_image(&unknown).await.expect_err("not found");
    assert_eq!(refused.code(), Some(tonic::Code::NotFound), "{refused}");
    // 1.14's ImageService.Pull is a single attempt: containerd's error, not go-retry's set.
    let expected = format!(
        "error pulling image: failed to pull image \"{unknown}\": failed to resolve reference \"{unknown}\": {unknown}: not found"
    );
    assert_eq!(message(&refused), expected);
    // Not in the store: the upgrade refuses it as any image not pulled.
    let err = client.upgrade(&unknown).await.expect_err("not pulled");
    assert_eq!(err.code(), Some(tonic::Code::Internal), "{err}");

    // Once the factory knows it, the same image pulls; other images pull as before.
    factory.register(&gvisor_and_ucode()).expect("register");
    assert_eq!(client.pull_image(&unknown).await.expect("pull"), unknown);
    let ghcr = "ghcr.io/siderolabs/installer:v1.14.1";
    assert_eq!(client.pull_image(ghcr).await.expect("pull"), ghcr);
    node.stop().await;
}

#[tokio::test]
async fn a_1_13_pull_of_an_unknown_schematic_carries_go_retrys_error_set() {
    let factory = SimFactory::default();
    let node = configured(
        3,
        "v1.13.9",
        &support::golden("1.13-controlplane-flannel-plain.yaml"),
        &factory,
    )
    .await;
    let client = support::admin("bundle-1.13.yaml", &node).await;
    let unknown = format!("factory.talos.dev/installer/{}:v1.13.9", "a".repeat(64));
    let refused = client.pull_image(&unknown).await.expect_err("not found");
    assert_eq!(refused.code(), Some(tonic::Code::NotFound), "{refused}");
    assert_eq!(
        message(&refused),
        format!(
            "error pulling image: 1 error(s) occurred:\n\tfailed to pull image \"{unknown}\": failed to resolve reference \"{unknown}\": {unknown}: not found"
        )
    );
    node.stop().await;
}

#[tokio::test]
async fn an_upgrade_with_a_schematic_installer_brings_its_extensions_after_the_reboot() {
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    let node = configured(
        4,
        "v1.14.1",
        &support::golden("1.14-controlplane-flannel-plain.yaml"),
        &factory,
    )
    .await;
    let client = support::admin("bundle-1.14.yaml", &node).await;
    // Installed from the factory's empty-schematic installer: its schematic extension alone.
    assert_eq!(
        client.extensions().await.expect("extensions"),
        vec![extension("schematic", EMPTY_ID)]
    );
    assert_eq!(
        client.schematic_id().await.expect("schematic").as_deref(),
        Some(EMPTY_ID)
    );

    let created = http(
        &factory,
        "POST",
        "/schematics",
        "customization:\n  extraKernelArgs:\n    - net.ifnames=0\n  systemExtensions:\n    officialExtensions:\n      - siderolabs/gvisor\n      - siderolabs/intel-ucode\n",
    )
    .await;
    assert_eq!(created.status, 201);
    let id = schematic::id(&gvisor_and_ucode()).expect("id");
    let image = format!(
        "{}/metal-installer/{id}:v1.14.2",
        factory.addr().expect("address")
    );
    client.pull_image(&image).await.expect("pull");
    client.upgrade(&image).await.expect("upgrade");
    // Installed to disk: the running system keeps its extensions until the reboot.
    assert_eq!(
        client.schematic_id().await.expect("schematic").as_deref(),
        Some(EMPTY_ID)
    );
    client.reboot().await.expect("reboot into the upgrade");
    eventually("the new version", WAIT, || async {
        node.talos_version() == "v1.14.2" && node.stage().await == Stage::Running
    })
    .await;
    let client = support::admin("bundle-1.14.yaml", &node).await;
    assert_eq!(
        client.extensions().await.expect("extensions"),
        vec![
            extension("gvisor", "v1.14.2"),
            extension("intel-ucode", "v1.14.2"),
            extension("schematic", &id),
        ]
    );
    assert_eq!(
        client.schematic_id().await.expect("schematic"),
        Some(id.clone())
    );
    let surfaced = image_factory_schematic(&client).await.expect("1.14 has it");
    assert_eq!(
        surfaced,
        format!(
            "schematicId: {id}\nflavor: Image Factory\napiUrl: {}\n",
            factory.url()
        )
    );

    // A plain installer carries no extensions at all.
    let plain = "ghcr.io/siderolabs/installer:v1.14.3";
    client.pull_image(plain).await.expect("pull");
    client.upgrade(plain).await.expect("upgrade");
    client.reboot().await.expect("reboot into the upgrade");
    eventually("the new version", WAIT, || async {
        node.talos_version() == "v1.14.3" && node.stage().await == Stage::Running
    })
    .await;
    let client = support::admin("bundle-1.14.yaml", &node).await;
    assert_eq!(client.extensions().await.expect("extensions"), vec![]);
    assert_eq!(client.schematic_id().await.expect("schematic"), None);
    let absent = image_factory_schematic(&client)
        .await
        .expect_err("no schematic extension, no resource");
    assert_eq!(absent.code(), tonic::Code::NotFound, "{absent}");
    node.stop().await;
}

#[tokio::test]
async fn nodes_never_installed_show_the_default_schematic_and_1_13_has_no_image_factory_schematic()
{
    let factory = SimFactory::default();
    let fresh = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(176 * 256 + 5),
        factory: factory.clone(),
        ..NodeSpec::new(addr(5), "v1.13.9")
    })
    .await
    .expect("start");
    let pinned = TalosClient::connect_maintenance(&fresh.addr().to_string(), &fresh.fingerprint())
        .await
        .expect("maintenance mode");
    assert_eq!(
        pinned.extensions().await.expect("extensions"),
        vec![extension("schematic", EMPTY_ID)]
    );
    let refused = image_factory_schematic(&pinned)
        .await
        .expect_err("1.13 has no such type");
    assert_eq!(refused.code(), tonic::Code::PermissionDenied, "{refused}");
    fresh.stop().await;

    // 1.13 installed from ghcr.io/siderolabs/installer: no extensions.
    let node = configured(
        6,
        "v1.13.9",
        &support::golden("1.13-controlplane-flannel-plain.yaml"),
        &factory,
    )
    .await;
    let client = support::admin("bundle-1.13.yaml", &node).await;
    assert_eq!(client.extensions().await.expect("extensions"), vec![]);
    node.stop().await;
}

#[tokio::test]
async fn an_install_from_an_installer_whose_schematic_is_unknown_fails_as_an_unpullable_image() {
    let factory = SimFactory::default();
    let node = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(176 * 256 + 7),
        factory: factory.clone(),
        ..NodeSpec::new(addr(7), "v1.13.9")
    })
    .await
    .expect("start");
    let unknown = format!(
        "factory.talos.dev/metal-installer/{}:v1.13.9",
        schematic::id(&gvisor_and_ucode()).expect("id")
    );
    let config = support::golden("1.13-controlplane-flannel-plain.yaml")
        .replace("/dev/sda", "/dev/vda")
        .replace("ghcr.io/siderolabs/installer:v1.13.9", &unknown);
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("maintenance mode")
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted: Talos pulls the installer only when it runs it");
    eventually("the install to fail", WAIT, || async {
        node.install_failure().await.is_some()
    })
    .await;
    assert_eq!(
        node.install_failure().await.as_deref(),
        Some(
            format!(
                "sequence failed: error running phase 2 in install sequence: task 1/1: failed, 1 error(s) occurred:\n\tfailed to pull image \"{unknown}\": failed to resolve reference \"{unknown}\": {unknown}: not found"
            )
            .as_str()
        )
    );
    assert!(!node.installed().await);
    eventually("the node back in maintenance mode", WAIT, || async {
        node.stage().await == Stage::Maintenance && node.is_serving().await
    })
    .await;

    // Once the factory knows the schematic, the same config installs, and the node's
    // extensions are the schematic's.
    factory.register(&gvisor_and_ucode()).expect("register");
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("maintenance mode")
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    eventually("installed", WAIT, || async { node.installed().await }).await;
    let client = support::admin("bundle-1.13.yaml", &node).await;
    let names: Vec<String> = client
        .extensions()
        .await
        .expect("extensions")
        .into_iter()
        .map(|e| e.name)
        .collect();
    assert_eq!(names, ["gvisor", "intel-ucode", "schematic"]);
    node.stop().await;
}

#[tokio::test]
async fn a_1_14_unattended_install_of_an_unknown_schematic_fails_until_the_factory_knows_it() {
    let factory = SimFactory::default();
    let node = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(176 * 256 + 8),
        factory: factory.clone(),
        ..NodeSpec::new(addr(8), "v1.14.1")
    })
    .await
    .expect("start");
    let id = schematic::id(&gvisor_and_ucode()).expect("id");
    let unknown = format!("factory.talos.dev/metal-installer/{id}:v1.14.1");
    let config = support::golden("1.14-controlplane-flannel-plain.yaml")
        .replace("/dev/sda", "/dev/vda")
        .replace(
            &format!("factory.talos.dev/metal-installer/{EMPTY_ID}:v1.14.1"),
            &unknown,
        );
    assert!(config.contains(&unknown));
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("maintenance mode")
        .apply_configuration(config.as_bytes(), ApplyMode::Auto)
        .await
        .expect("accepted");
    let expected = format!(
        "1 error(s) occurred:\n\tfailed to pull image \"{unknown}\": failed to resolve reference \"{unknown}\": {unknown}: not found"
    );
    eventually("the installer to fail", WAIT, || async {
        node.unattended_install().await == Some(("failed", expected.clone()))
    })
    .await;
    assert!(!node.installed().await);
    // The controller tries again after its backoff: once the factory knows the schematic, the
    // install completes.
    factory.register(&gvisor_and_ucode()).expect("register");
    eventually("installed", WAIT, || async { node.installed().await }).await;
    let client = support::admin("bundle-1.14.yaml", &node).await;
    eventually("the installer's extensions", WAIT, || async {
        client.schematic_id().await.ok().flatten().as_deref() == Some(id.as_str())
    })
    .await;
    node.stop().await;
}
