//! The simulated BMC (`ichor_sim` crate doc, "BMC"; talos-facts §15): its power and boot
//! actions reach the node, its Redfish answers follow DSP0266, and two real clients drive it:
//! the DMTF's Redfish-Protocol-Validator and OpenStack's `sushy`, both from the Python virtual
//! environment whose `bin` folder `ICHOR_REDFISH_TOOLS` names.

mod support;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use base64::Engine as _;
use ichor_api::schematic::Schematic;
use ichor_sim::{BmcFault, BmcSpec, Hardware, NodeSpec, SimBmc, SimFactory, SimNode, Stage};
use ichor_talos::TalosClient;
use ichor_testenv::wait::eventually;
use rustls::pki_types::pem::PemObject as _;
use rustls::pki_types::{CertificateDer, ServerName};
use serde_json::{Value, json};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

/// How long the simulated machine gets for what a test waits for.
const WAIT: Duration = Duration::from_secs(10);
/// The BMC account of these tests.
const USER: &str = "admin";
const PASSWORD: &str = "bmc-secret-1";
const SYSTEM: &str = "/redfish/v1/Systems/system";
const RESET: &str = "/redfish/v1/Systems/system/Actions/ComputerSystem.Reset";
const INSERT: &str = "/redfish/v1/Managers/bmc/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia";
const EJECT: &str = "/redfish/v1/Managers/bmc/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia";
const CD: &str = "/redfish/v1/Managers/bmc/VirtualMedia/Cd";

/// One HTTP answer: status, headers (lowercased names), body.
#[derive(Debug)]
struct Reply {
    status: u16,
    headers: Vec<(String, String)>,
    body: Vec<u8>,
}

impl Reply {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }

    fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    /// The message ids of a Redfish error body.
    fn message_ids(&self) -> Vec<String> {
        self.json()["error"]["@Message.ExtendedInfo"]
            .as_array()
            .map(|infos| {
                infos
                    .iter()
                    .filter_map(|i| i["MessageId"].as_str().map(str::to_owned))
                    .collect()
            })
            .unwrap_or_default()
    }
}

/// How a request authenticates.
#[derive(Clone, Copy)]
enum Auth<'a> {
    None,
    Basic(&'a str, &'a str),
    Token(&'a str),
}

/// One HTTPS/1.1 request to `bmc`, trusting only its CA.
async fn call(
    bmc: &SimBmc,
    method: &str,
    path: &str,
    auth: Auth<'_>,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Reply {
    tokio::time::timeout(WAIT, exchange(bmc, method, path, auth, headers, body))
        .await
        .unwrap_or_else(|_| panic!("{method} {path}: no answer within {WAIT:?}"))
}

async fn exchange(
    bmc: &SimBmc,
    method: &str,
    path: &str,
    auth: Auth<'_>,
    headers: &[(&str, &str)],
    body: Option<&[u8]>,
) -> Reply {
    let mut roots = rustls::RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(bmc.ca_pem().as_bytes()).expect("the CA's PEM"))
        .expect("a root");
    let config = rustls::ClientConfig::builder_with_provider(Arc::new(
        rustls::crypto::ring::default_provider(),
    ))
    .with_safe_default_protocol_versions()
    .expect("TLS versions")
    .with_root_certificates(roots)
    .with_no_client_auth();
    let tcp = tokio::net::TcpStream::connect(bmc.addr())
        .await
        .expect("the BMC accepts");
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::IpAddress(bmc.addr().ip().into()), tcp)
        .await
        .expect("a TLS session with the BMC's certificate");
    let body = body.unwrap_or_default();
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nhost: {}\r\nconnection: close\r\ncontent-length: {}\r\n",
        bmc.addr(),
        body.len()
    );
    if !body.is_empty() {
        head.push_str("content-type: application/json\r\n");
    }
    match auth {
        Auth::None => {}
        Auth::Basic(user, password) => {
            let encoded =
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"));
            head.push_str(&format!("authorization: Basic {encoded}\r\n"));
        }
        Auth::Token(token) => head.push_str(&format!("x-auth-token: {token}\r\n")),
    }
    for (name, value) in headers {
        head.push_str(&format!("{name}: {value}\r\n"));
    }
    head.push_str("\r\n");
    tls.write_all(head.as_bytes()).await.expect("write");
    // A server refusing a body it will not read may close before it is all written.
    let _ = tls.write_all(body).await;
    let mut raw = Vec::new();
    // A server may close without TLS close_notify: what arrived is the answer.
    let _ = tls.read_to_end(&mut raw).await;
    parse(&raw, method == "HEAD")
}

fn parse(raw: &[u8], head_only: bool) -> Reply {
    let split = raw
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .expect("a complete answer");
    let head = String::from_utf8_lossy(&raw[..split]).into_owned();
    let mut lines = head.lines();
    let status = lines
        .next()
        .and_then(|l| l.split(' ').nth(1))
        .and_then(|c| c.parse().ok())
        .expect("a status line");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_lowercase(), v.trim().to_owned()))
        .collect();
    let rest = &raw[split + 4..];
    let chunked = headers
        .iter()
        .any(|(n, v)| n == "transfer-encoding" && v.contains("chunked"));
    let body = if head_only {
        Vec::new()
    } else if chunked {
        dechunk(rest)
    } else {
        rest.to_vec()
    };
    Reply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut rest: &[u8]) -> Vec<u8> {
    let mut body = Vec::new();
    while let Some(end) = rest.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(String::from_utf8_lossy(&rest[..end]).trim(), 16).unwrap_or(0);
        if size == 0 {
            break;
        }
        body.extend_from_slice(&rest[end + 2..end + 2 + size]);
        rest = &rest[end + 2 + size + 2..];
    }
    body
}

async fn get(bmc: &SimBmc, path: &str) -> Reply {
    call(bmc, "GET", path, Auth::Basic(USER, PASSWORD), &[], None).await
}

async fn post(bmc: &SimBmc, path: &str, body: &Value) -> Reply {
    let bytes = serde_json::to_vec(body).expect("JSON");
    call(
        bmc,
        "POST",
        path,
        Auth::Basic(USER, PASSWORD),
        &[],
        Some(&bytes),
    )
    .await
}

async fn reset(bmc: &SimBmc, kind: &str) {
    let reply = post(bmc, RESET, &json!({"ResetType": kind})).await;
    assert_eq!(
        reply.status,
        204,
        "{kind}: {}",
        String::from_utf8_lossy(&reply.body)
    );
}

async fn power_state(bmc: &SimBmc) -> String {
    get(bmc, SYSTEM).await.json()["PowerState"]
        .as_str()
        .unwrap_or_default()
        .to_owned()
}

/// Sets the boot override with the system's current ETag.
async fn boot_override(bmc: &SimBmc, target: &str, enabled: &str) {
    let etag = get(bmc, SYSTEM)
        .await
        .header("etag")
        .expect("an ETag")
        .to_owned();
    let body = serde_json::to_vec(&json!({"Boot": {
        "BootSourceOverrideTarget": target,
        "BootSourceOverrideEnabled": enabled,
    }}))
    .expect("JSON");
    let reply = call(
        bmc,
        "PATCH",
        SYSTEM,
        Auth::Basic(USER, PASSWORD),
        &[("if-match", &etag)],
        Some(&body),
    )
    .await;
    assert_eq!(
        reply.status,
        200,
        "{}",
        String::from_utf8_lossy(&reply.body)
    );
}

/// A node with a BMC: a small VM in maintenance mode (or powered off), on free loopback ports.
async fn machine(seed: u32, version: &str, factory: &SimFactory, bmc: BmcSpec) -> SimNode {
    SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(seed),
        factory: factory.clone(),
        bmc: Some(bmc),
        ..NodeSpec::new("127.0.0.1:0".parse().expect("address"), version)
    })
    .await
    .expect("start")
}

fn spec() -> BmcSpec {
    BmcSpec::new(USER, PASSWORD)
}

fn bmc_of(node: &SimNode) -> SimBmc {
    node.bmc().expect("the node has a BMC").clone()
}

/// The node's maintenance API answers with its current certificate: its Talos version.
async fn talos_version(node: &SimNode) -> Result<String, String> {
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .map_err(|e| e.to_string())?;
    client.version().await.map_err(|e| e.to_string())
}

/// A schematic the factory knows, and the URL of its metal ISO for `version`.
fn gvisor_iso(factory: &SimFactory, version: &str) -> String {
    let schematic = Schematic {
        system_extensions: vec!["siderolabs/gvisor".into()],
        ..Schematic::default()
    };
    let id = factory.register(&schematic).expect("registered");
    format!("{}/image/{id}/{version}/metal-amd64.iso", factory.url())
}

#[tokio::test]
async fn power_off_silences_the_node_and_power_on_brings_it_back() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0001, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    assert_eq!(talos_version(&node).await.as_deref(), Ok("v1.14.1"));
    assert_eq!(power_state(&bmc).await, "On");

    reset(&bmc, "ForceOff").await;
    assert_eq!(power_state(&bmc).await, "Off");
    assert!(!node.is_powered().await);
    let silent = talos_version(&node).await;
    assert!(
        silent.is_err(),
        "a node powered off answers nothing: {silent:?}"
    );

    reset(&bmc, "On").await;
    assert_eq!(power_state(&bmc).await, "On");
    let version = eventually("the node's API back", WAIT, || async {
        talos_version(&node).await
    })
    .await;
    assert_eq!(
        version, "v1.14.1",
        "booted from its disk as after a restart"
    );
    assert_eq!(node.stage().await, Stage::Maintenance);
    node.stop().await;
}

#[tokio::test]
async fn a_one_time_cd_boot_lands_in_maintenance_with_the_isos_version_and_schematic() {
    let factory = SimFactory::default();
    let node = machine(
        0x0b0c_0002,
        "v1.14.1",
        &factory,
        BmcSpec {
            powered_off: true,
            ..spec()
        },
    )
    .await;
    let bmc = bmc_of(&node);
    assert_eq!(power_state(&bmc).await, "Off");
    assert!(!node.is_serving().await, "a machine known only by its BMC");

    let iso = gvisor_iso(&factory, "v1.13.9");
    let inserted = post(&bmc, INSERT, &json!({"Image": iso})).await;
    assert_eq!(
        inserted.status,
        204,
        "{}",
        String::from_utf8_lossy(&inserted.body)
    );
    let cd = get(&bmc, CD).await.json();
    assert_eq!(cd["Image"], json!(iso));
    assert_eq!(cd["Inserted"], json!(true));
    assert_eq!(cd["ImageName"], json!("metal-amd64.iso"));
    boot_override(&bmc, "Cd", "Once").await;

    reset(&bmc, "On").await;
    let version = eventually("the node in maintenance mode", WAIT, || async {
        talos_version(&node).await
    })
    .await;
    assert_eq!(version, "v1.13.9", "the version the ISO's URL names");
    assert_eq!(node.stage().await, Stage::Maintenance);
    let client = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("connect");
    let extensions = client.extensions().await.expect("extensions");
    assert!(
        extensions.iter().any(|e| e.name == "gvisor"),
        "the ISO's schematic: {extensions:?}"
    );
    let boot = get(&bmc, SYSTEM).await.json()["Boot"].clone();
    assert_eq!(
        boot["BootSourceOverrideEnabled"], "Disabled",
        "Once is consumed"
    );
    assert_eq!(boot["BootSourceOverrideTarget"], "Cd");

    let ejected = post(&bmc, EJECT, &json!({})).await;
    assert_eq!(ejected.status, 204);
    assert_eq!(get(&bmc, CD).await.json()["Inserted"], json!(false));
    node.stop().await;
}

#[tokio::test]
async fn media_the_factory_cannot_serve_is_refused_at_insert() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0003, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let unknown = format!(
        "{}/image/{}/v1.14.1/metal-amd64.iso",
        factory.url(),
        "ab".repeat(32)
    );
    let refused = post(&bmc, INSERT, &json!({"Image": unknown})).await;
    assert_eq!(
        refused.status, 400,
        "an unknown schematic is the factory's 404"
    );
    assert!(String::from_utf8_lossy(&refused.body).contains("schematic not found"));

    let elsewhere = post(&bmc, INSERT, &json!({"Image": "http://127.0.0.1:9/x.iso"})).await;
    assert_eq!(elsewhere.status, 500, "nothing serves it");
    assert_eq!(
        elsewhere.message_ids(),
        ["Base.1.22.CouldNotEstablishConnection"]
    );

    let old = gvisor_iso(&factory, "v1.12.0");
    assert_eq!(post(&bmc, INSERT, &json!({"Image": old})).await.status, 400);
    let missing = post(&bmc, INSERT, &json!({"Inserted": true})).await;
    assert_eq!(missing.message_ids(), ["Base.1.22.ActionParameterMissing"]);
    assert_eq!(
        get(&bmc, CD).await.json()["Image"],
        Value::Null,
        "nothing inserted"
    );
    node.stop().await;
}

#[tokio::test]
async fn force_restart_and_power_cycle_are_power_cycles() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0004, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    for kind in ["ForceRestart", "PowerCycle"] {
        let before = node.fingerprint();
        reset(&bmc, kind).await;
        eventually("a new boot", WAIT, || async {
            node.is_serving().await && node.fingerprint() != before
        })
        .await;
        assert_eq!(power_state(&bmc).await, "On");
        assert_eq!(talos_version(&node).await.as_deref(), Ok("v1.14.1"));
    }
    node.stop().await;
}

#[tokio::test]
async fn graceful_shutdown_is_the_power_button_and_graceful_restart_comes_back() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0005, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    reset(&bmc, "GracefulShutdown").await;
    eventually("the machine off", WAIT, || async {
        !node.is_powered().await
    })
    .await;
    assert!(!node.is_serving().await);
    assert_eq!(power_state(&bmc).await, "Off");

    reset(&bmc, "On").await;
    eventually("the machine up", WAIT, || async { node.is_serving().await }).await;
    let before = node.fingerprint();
    reset(&bmc, "GracefulRestart").await;
    eventually("a new boot after the shutdown", WAIT, || async {
        node.is_serving().await && node.fingerprint() != before
    })
    .await;
    assert_eq!(power_state(&bmc).await, "On");
    node.stop().await;
}

#[tokio::test]
async fn an_iso_on_a_disk_with_talos_installed_halts_and_the_disk_boots_after() {
    let factory = SimFactory::default();
    let node = SimNode::spawn(NodeSpec {
        hardware: Hardware::vm(0x0b0c_0006),
        config: Some(support::golden("1.13-controlplane-flannel-plain.yaml")),
        factory: factory.clone(),
        bmc: Some(spec()),
        ..NodeSpec::new("127.0.0.1:0".parse().expect("address"), "v1.13.9")
    })
    .await
    .expect("start");
    assert!(node.installed().await);
    let bmc = bmc_of(&node);
    let iso = gvisor_iso(&factory, "v1.14.1");
    assert_eq!(post(&bmc, INSERT, &json!({"Image": iso})).await.status, 204);
    boot_override(&bmc, "Cd", "Once").await;
    reset(&bmc, "PowerCycle").await;
    eventually("the boot halted", WAIT, || async { node.halted().await }).await;
    assert!(!node.is_serving().await, "halted: nothing answers");
    assert_eq!(power_state(&bmc).await, "On");

    reset(&bmc, "PowerCycle").await;
    let client = support::admin("bundle-1.13.yaml", &node).await;
    assert_eq!(
        client.version().await.expect("version"),
        "v1.13.9",
        "the disk's Talos"
    );
    node.stop().await;
}

#[tokio::test]
async fn the_system_reports_the_smbios_uuid_or_its_swapped_order() {
    let factory = SimFactory::default();
    let plain = machine(0x0b0c_0007, "v1.14.1", &factory, spec()).await;
    let swapped = machine(
        0x0b0c_0007,
        "v1.14.1",
        &factory,
        BmcSpec {
            swapped_uuid: true,
            ..spec()
        },
    )
    .await;
    let smbios = plain.hardware().uuid.clone();
    assert_eq!(smbios, "5a1a0000-0000-4000-8000-00000b0c0007");
    let reported = |reply: Reply| reply.json()["UUID"].as_str().unwrap_or_default().to_owned();
    assert_eq!(reported(get(&bmc_of(&plain), SYSTEM).await), smbios);
    assert_eq!(
        reported(get(&bmc_of(&swapped), SYSTEM).await),
        "00001a5a-0000-0040-8000-00000b0c0007"
    );
    plain.stop().await;
    swapped.stop().await;
}

#[tokio::test]
async fn wrong_credentials_get_401_and_a_changed_password_ends_sessions() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0008, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let root = call(&bmc, "GET", "/redfish/v1/", Auth::None, &[], None).await;
    assert_eq!(root.status, 200, "the service root needs no credentials");

    let wrong = call(&bmc, "GET", SYSTEM, Auth::Basic(USER, "nope"), &[], None).await;
    assert_eq!(wrong.status, 401);
    assert!(
        wrong
            .header("www-authenticate")
            .is_some_and(|v| v.starts_with("Basic"))
    );
    assert_eq!(wrong.message_ids(), ["Base.1.22.NoValidSession"]);
    assert!(!String::from_utf8_lossy(&wrong.body).contains("nope"));
    let none = call(&bmc, "GET", SYSTEM, Auth::None, &[], None).await;
    assert_eq!(none.status, 401);

    let login = serde_json::to_vec(&json!({"UserName": USER, "Password": PASSWORD})).expect("JSON");
    let created = call(
        &bmc,
        "POST",
        "/redfish/v1/SessionService/Sessions",
        Auth::None,
        &[],
        Some(&login),
    )
    .await;
    assert_eq!(created.status, 201);
    let token = created.header("x-auth-token").expect("a token").to_owned();
    let location = created.header("location").expect("a location").to_owned();
    assert_eq!(created.json()["@odata.id"], json!(location));
    let by_token = call(&bmc, "GET", SYSTEM, Auth::Token(&token), &[], None).await;
    assert_eq!(by_token.status, 200);

    bmc.inject(BmcFault::Password("rotated-2".into()));
    let old = call(&bmc, "GET", SYSTEM, Auth::Basic(USER, PASSWORD), &[], None).await;
    assert_eq!(
        old.status, 401,
        "the credentials a client was given no longer work"
    );
    let stale = call(&bmc, "GET", SYSTEM, Auth::Token(&token), &[], None).await;
    assert_eq!(stale.status, 401, "its sessions ended");
    let new = call(
        &bmc,
        "GET",
        SYSTEM,
        Auth::Basic(USER, "rotated-2"),
        &[],
        None,
    )
    .await;
    assert_eq!(new.status, 200);
    node.stop().await;
}

#[tokio::test]
async fn a_read_only_account_reads_but_cannot_power_the_machine() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_000d, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let account = json!({"UserName": "viewer", "Password": "viewer-pw-1", "RoleId": "ReadOnly"});
    let created = post(&bmc, "/redfish/v1/AccountService/Accounts", &account).await;
    assert_eq!(
        created.status,
        201,
        "{}",
        String::from_utf8_lossy(&created.body)
    );
    let location = created.header("location").expect("a location").to_owned();
    assert_eq!(created.json()["RoleId"], "ReadOnly");
    assert_eq!(created.json()["Password"], Value::Null);
    let again = post(&bmc, "/redfish/v1/AccountService/Accounts", &account).await;
    assert_eq!(again.status, 409, "a user name is taken once");

    let viewer = Auth::Basic("viewer", "viewer-pw-1");
    assert_eq!(
        call(&bmc, "GET", SYSTEM, viewer, &[], None).await.status,
        200
    );
    let off = serde_json::to_vec(&json!({"ResetType": "ForceOff"})).expect("JSON");
    let refused = call(&bmc, "POST", RESET, viewer, &[], Some(&off)).await;
    assert_eq!(refused.status, 403);
    assert_eq!(refused.message_ids(), ["Base.1.22.InsufficientPrivilege"]);
    assert!(node.is_powered().await, "nothing happened");
    let promote = serde_json::to_vec(&json!({"RoleId": "Administrator"})).expect("JSON");
    let refused = call(&bmc, "PATCH", &location, viewer, &[], Some(&promote)).await;
    assert_eq!(
        refused.status, 403,
        "a read-only account cannot raise its own role"
    );

    let deleted = call(
        &bmc,
        "DELETE",
        &location,
        Auth::Basic(USER, PASSWORD),
        &[],
        None,
    )
    .await;
    assert_eq!(deleted.status, 204);
    assert_eq!(
        call(&bmc, "GET", SYSTEM, viewer, &[], None).await.status,
        401
    );
    node.stop().await;
}

#[tokio::test]
async fn an_unresponsive_bmc_holds_requests_until_healed() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_0009, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    bmc.inject(BmcFault::Unresponsive(true));
    let before = bmc.requests();
    let held = tokio::spawn({
        let bmc = bmc.clone();
        async move { exchange(&bmc, "GET", SYSTEM, Auth::Basic(USER, PASSWORD), &[], None).await }
    });
    eventually("the request at the BMC", WAIT, || async {
        bmc.requests() > before
    })
    .await;
    assert!(!held.is_finished(), "an unresponsive BMC answers nothing");
    bmc.inject(BmcFault::Unresponsive(false));
    let reply = tokio::time::timeout(WAIT, held)
        .await
        .expect("answered once healed")
        .expect("the request task");
    assert_eq!(reply.status, 200);
    node.stop().await;
}

#[tokio::test]
async fn redfish_answers_follow_dsp0266() {
    let factory = SimFactory::default();
    let node = machine(0x0b0c_000a, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let basic = Auth::Basic(USER, PASSWORD);

    let missing = get(&bmc, "/redfish/v1/Systems/other").await;
    assert_eq!(missing.status, 404);
    assert_eq!(missing.header("odata-version"), Some("4.0"));
    assert_eq!(missing.message_ids(), ["Base.1.22.ResourceMissingAtURI"]);

    let delete = call(&bmc, "DELETE", SYSTEM, basic, &[], None).await;
    assert_eq!(delete.status, 405);
    assert_eq!(delete.header("allow"), Some("GET, HEAD, PATCH"));

    let system = get(&bmc, SYSTEM).await;
    assert_eq!(system.header("odata-version"), Some("4.0"));
    assert!(system.header("link").is_some_and(
        |l| l.contains("ComputerSystem.v1_27_0.json") && l.contains("rel=describedby")
    ));
    let json = system.json();
    assert_eq!(
        json["@odata.type"],
        "#ComputerSystem.v1_27_0.ComputerSystem"
    );
    assert_eq!(
        json["Actions"]["#ComputerSystem.Reset"]["target"],
        json!(RESET)
    );
    assert_eq!(
        json["Boot"]["BootSourceOverrideTarget@Redfish.AllowableValues"],
        json!(["None", "Cd", "Hdd"])
    );

    let stale =
        serde_json::to_vec(&json!({"Boot": {"BootSourceOverrideTarget": "Cd"}})).expect("JSON");
    let refused = call(
        &bmc,
        "PATCH",
        SYSTEM,
        basic,
        &[("if-match", "\"0000\"")],
        Some(&stale),
    )
    .await;
    assert_eq!(refused.status, 412);
    assert_eq!(refused.message_ids(), ["Base.1.22.PreconditionFailed"]);

    let bad = serde_json::to_vec(&json!({"BogusProp": 1, "UUID": "x"})).expect("JSON");
    let refused = call(&bmc, "PATCH", SYSTEM, basic, &[], Some(&bad)).await;
    assert_eq!(refused.status, 400);
    let ids = refused.message_ids();
    assert!(
        ids.contains(&"Base.1.22.PropertyUnknown".to_owned()),
        "{ids:?}"
    );
    assert!(
        ids.contains(&"Base.1.22.PropertyNotWritable".to_owned()),
        "{ids:?}"
    );
    assert_eq!(
        get(&bmc, SYSTEM).await.header("etag"),
        system.header("etag"),
        "nothing changed"
    );

    let nmi = post(&bmc, RESET, &json!({"ResetType": "Nmi"})).await;
    assert_eq!(
        nmi.message_ids(),
        ["Base.1.22.ActionParameterValueNotInList"]
    );
    let malformed = call(&bmc, "POST", RESET, basic, &[], Some(b"{not json")).await;
    assert_eq!(malformed.message_ids(), ["Base.1.22.MalformedJSON"]);
    let large = vec![b' '; 70 * 1024];
    let too_large = call(&bmc, "POST", RESET, basic, &[], Some(&large)).await;
    assert_eq!(too_large.status, 413);

    let head = call(&bmc, "HEAD", "/redfish/v1/", Auth::None, &[], None).await;
    assert_eq!(head.status, 200);
    assert!(head.header("allow").is_some());
    let expand = call(&bmc, "GET", "/redfish/v1/?$expand=*", basic, &[], None).await;
    assert_eq!(expand.status, 501);
    let odata = call(
        &bmc,
        "GET",
        "/redfish/v1/",
        Auth::None,
        &[("odata-version", "4.1")],
        None,
    )
    .await;
    assert_eq!(odata.status, 412);
    let unchanged = call(
        &bmc,
        "GET",
        SYSTEM,
        basic,
        &[("if-none-match", system.header("etag").expect("an ETag"))],
        None,
    )
    .await;
    assert_eq!(unchanged.status, 304);
    node.stop().await;
}

/// The bin folder of the Python virtual environment with `sushy` and the DMTF
/// Redfish-Protocol-Validator.
fn redfish_tools() -> PathBuf {
    match std::env::var_os("ICHOR_REDFISH_TOOLS") {
        Some(bin) if !bin.is_empty() => PathBuf::from(bin),
        _ => panic!(
            "ICHOR_REDFISH_TOOLS is not set: it must name the bin folder of a Python virtual \
             environment with sushy and redfish-protocol-validator installed: `cargo xtask test` sets it, \
             `cargo xtask redfish-tools` installs one and prints the folder"
        ),
    }
}

/// The Python helpers of these tests.
fn helper(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/bmc")
        .join(name)
}

/// The venv's Python running `script`, trusting the CA it is given: `requests` lets
/// `REQUESTS_CA_BUNDLE` and `CURL_CA_BUNDLE` replace the trust a `Session` was given, so they
/// are left out.
fn python(tools: &std::path::Path, script: &str) -> tokio::process::Command {
    let mut command = tokio::process::Command::new(tools.join("python"));
    command
        .arg(helper(script))
        .env_remove("REQUESTS_CA_BUNDLE")
        .env_remove("CURL_CA_BUNDLE");
    command
}

#[tokio::test]
async fn the_dmtf_redfish_protocol_validator_reports_no_failure() {
    let tools = redfish_tools();
    let factory = SimFactory::default();
    let node = machine(0x0b0c_000b, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, bmc.ca_pem()).expect("write the CA");
    let reports = dir.path().join("reports");
    let output = python(&tools, "validate.py")
        .arg(tools.join("rf_protocol_validator"))
        .args([
            "--rhost",
            &bmc.url(),
            "--user",
            USER,
            "--password",
            PASSWORD,
        ])
        .arg("--ca-bundle")
        .arg(&ca)
        .arg("--report-dir")
        .arg(&reports)
        .output()
        .await
        .expect("run the validator");
    let report = String::from_utf8_lossy(&output.stdout);
    println!("{report}");
    assert!(
        output.status.success(),
        "the validator reported failures:\n{report}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    for assertion in [
        "PROTO_STD_URIS_SUPPORTED",
        "REQ_HEADERS_ODATA_VERSION",
        "RESP_HEADERS_ALLOW_METHOD_NOT_ALLOWED",
        "SEC_BOTH_AUTH_TYPES",
        "SEC_PRIV_SUPPORT_PREDEFINED_ROLES",
        "SEC_PRIV_OPERATION_TO_PRIV_MAPPING",
        "SEC_ACCOUNTS_SUPPORT_ETAGS",
        "REQ_HEADERS_IF_MATCH",
        "REQ_PATCH_BAD_PROP",
        "REQ_PATCH_ODATA_PROPS",
        "RESP_STATUS_BAD_REQUEST",
        "PROTO_ETAG_IF_MATCH_ENFORCED",
        "PROTO_ETAG_LOST_UPDATE",
    ] {
        assert!(
            report.contains(&format!("PASS {assertion}")),
            "{assertion} was not passed:\n{report}"
        );
    }
    node.stop().await;
}

/// A plain HTTP GET to the factory: status, headers, body.
async fn factory_get(factory: &SimFactory, path: &str) -> Reply {
    let addr = factory.addr().expect("a started factory");
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .expect("the factory answers");
    let request = format!("GET {path} HTTP/1.1\r\nhost: {addr}\r\nconnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("write");
    let mut raw = Vec::new();
    stream.read_to_end(&mut raw).await.expect("read");
    parse(&raw, false)
}

#[tokio::test]
async fn the_simulated_factory_serves_the_isos_a_bmc_downloads() {
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    let iso = gvisor_iso(&factory, "v1.14.1");
    let path = iso.trim_start_matches(&factory.url());
    let served = factory_get(&factory, path).await;
    assert_eq!(served.status, 200);
    assert_eq!(
        served.header("content-disposition"),
        Some("attachment; filename=\"metal-amd64.iso\"")
    );
    let unknown = format!("/image/{}/v1.14.1/metal-amd64.iso", "ab".repeat(32));
    let missing = factory_get(&factory, &unknown).await;
    assert_eq!(missing.status, 404);
    assert_eq!(
        String::from_utf8_lossy(&missing.body),
        "schematic not found\n"
    );
}

#[tokio::test]
async fn sushy_reads_the_system_powers_it_and_boots_it_from_virtual_media() {
    let tools = redfish_tools();
    let factory = SimFactory::start("127.0.0.1:0".parse().expect("address"))
        .await
        .expect("a factory");
    let node = machine(0x0b0c_000c, "v1.14.1", &factory, spec()).await;
    let bmc = bmc_of(&node);
    let iso = gvisor_iso(&factory, "v1.13.9");
    let dir = tempfile::tempdir().expect("a temporary folder");
    let ca = dir.path().join("ca.pem");
    std::fs::write(&ca, bmc.ca_pem()).expect("write the CA");
    let output = python(&tools, "sushy_drive.py")
        .args(["--url", &bmc.url(), "--user", USER, "--password", PASSWORD])
        .arg("--ca")
        .arg(&ca)
        .args(["--iso", &iso, "--uuid", &node.hardware().uuid])
        .output()
        .await
        .expect("run sushy");
    assert!(
        output.status.success(),
        "sushy's session failed:\n{}\n{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    let version = eventually("the node booted from the ISO", WAIT, || async {
        talos_version(&node).await
    })
    .await;
    assert_eq!(version, "v1.13.9");
    assert_eq!(node.stage().await, Stage::Maintenance);
    node.stop().await;
}
