//! The simulator as talosctl's `--wait` tracker sees it (talos-facts §10): the machine event
//! stream across a reboot (actor ids, tail ids, the new boot's events), the boot id, a reset
//! that powers the node off, machined's roles per method, the Version and ServiceList fields,
//! and methods the simulator does not serve answering so.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use ichor_api::common::Role;
use ichor_render::pki::Role as TalosRole;
use ichor_sim::{Hardware, SimNode};
use ichor_talos::TalosClient;
use ichor_talos::api::machine::machine_service_client::MachineServiceClient;
use ichor_talos::api::machine::machine_status_event::MachineStage;
use ichor_talos::api::machine::{
    Event, EventsRequest, MachineStatusEvent, ReadRequest, RebootRequest, ResetPartitionSpec,
    ResetRequest, RestartEvent, SequenceEvent, TaskEvent,
};
use ichor_testenv::nets::TALOS_EVENTS;
use ichor_testenv::wait::eventually;
use prost::Message as _;
use support::{NodeConfig, WAIT, admin, bundle_for, credentials, node_config};
use tokio_stream::StreamExt as _;
use tonic::transport::Channel;

const BOOT_ID: &str = "/proc/sys/kernel/random/boot_id";

fn addr(host: u8) -> SocketAddr {
    SocketAddr::from((TALOS_EVENTS.ip(0, host), 50000))
}

/// A bootstrapped control plane with a CNI, so it becomes ready (talos-facts §3, §8.3).
async fn ready_control_plane(b: &ichor_render::SecretsBundle, host: u8) -> SimNode {
    let config = node_config(
        b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: "v1.14.1",
            endpoint_host: &addr(host).ip().to_string(),
            hostname: Some("cp-1"),
            cni: "flannel",
            install: true,
        },
    );
    let node = SimNode::start_configured(addr(host), "v1.14.1", Hardware::vm(host.into()), &config)
        .await
        .expect("start");
    admin(b, node.addr())
        .await
        .bootstrap(Duration::from_secs(5))
        .await
        .expect("bootstrap");
    node
}

fn machine(client: &TalosClient) -> MachineServiceClient<Channel> {
    MachineServiceClient::new(client.channel())
}

async fn boot_id(client: &TalosClient) -> String {
    let mut stream = machine(client)
        .read(ReadRequest {
            path: BOOT_ID.into(),
        })
        .await
        .expect("read")
        .into_inner();
    let mut text = Vec::new();
    while let Some(chunk) = stream.next().await {
        text.extend(chunk.expect("chunk").bytes);
    }
    String::from_utf8(text).expect("utf-8")
}

/// The payload of an event, decoded by its type URL as talosctl decodes it.
#[derive(Debug)]
enum Seen {
    Sequence(SequenceEvent),
    Task(TaskEvent),
    Restart(RestartEvent),
    Status(MachineStatusEvent),
    Other,
}

fn decode(event: &Event) -> Seen {
    let data = event.data.clone().unwrap_or_default();
    let bytes = data.value.as_slice();
    match data.type_url.as_str() {
        "talos/runtime/machine.SequenceEvent" => {
            Seen::Sequence(SequenceEvent::decode(bytes).expect("decode"))
        }
        "talos/runtime/machine.TaskEvent" => Seen::Task(TaskEvent::decode(bytes).expect("decode")),
        "talos/runtime/machine.RestartEvent" => {
            Seen::Restart(RestartEvent::decode(bytes).expect("decode"))
        }
        "talos/runtime/machine.MachineStatusEvent" => {
            Seen::Status(MachineStatusEvent::decode(bytes).expect("decode"))
        }
        _ => Seen::Other,
    }
}

/// Every event of a stream until it ends (the node went down), after its hello.
async fn drain(stream: &mut tonic::Streaming<Event>) -> Vec<Event> {
    let mut out = Vec::new();
    while let Ok(Some(event)) = stream.message().await {
        out.push(event);
    }
    out
}

#[tokio::test]
async fn a_reboot_is_followed_through_its_events_and_the_new_boot() {
    let b = bundle_for(92);
    let node = ready_control_plane(&b, 10).await;
    let client = admin(&b, node.addr()).await;
    let before = boot_id(&client).await;
    assert_eq!(before.len(), 37, "a UUID and a newline: {before:?}");
    assert_eq!(
        client.boot_id().await.expect("the typed read"),
        before.trim(),
        "the client's boot id is the file's UUID"
    );

    let mut stream = machine(&client)
        .events(EventsRequest::default())
        .await
        .expect("events")
        .into_inner();
    let hello = stream.message().await.expect("hello").expect("hello");
    assert_eq!(hello.data.as_ref().map(|d| d.type_url.as_str()), Some(""));
    assert_eq!(hello.id.len(), 20, "an xid");

    let actor = machine(&client)
        .reboot(RebootRequest::default())
        .await
        .expect("reboot")
        .into_inner()
        .messages[0]
        .actor_id
        .clone();
    assert_eq!(actor.len(), 36, "a UUID: {actor}");
    let events = drain(&mut stream).await;
    let ids: Vec<&str> = events.iter().map(|e| e.id.as_str()).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "ids grow: {ids:?}");
    let mine: Vec<Seen> = events
        .iter()
        .filter(|e| e.actor_id == actor)
        .map(decode)
        .collect();
    assert!(
        matches!(mine.first(), Some(Seen::Sequence(s)) if s.sequence == "reboot" && s.action == 1),
        "{mine:?}"
    );
    assert!(
        mine.iter()
            .any(|s| matches!(s, Seen::Task(t) if t.task == "stopAllServices")),
        "{mine:?}"
    );
    assert!(
        mine.iter()
            .any(|s| matches!(s, Seen::Restart(r) if r.cmd == 0x4558_4543)),
        "an installed node kexecs: {mine:?}"
    );
    let Some(Seen::Sequence(last)) = mine.last() else {
        panic!("{mine:?}")
    };
    assert_eq!(last.action, 0, "NOOP carrying the reboot 'error'");
    assert_eq!(
        last.error.as_ref().map(|e| e.message.as_str()),
        Some(
            "sequence failed: error running phase 14 in reboot sequence: task 1/1: failed, unix.Reboot(45584543)"
        )
    );
    assert!(
        events
            .iter()
            .map(decode)
            .any(|s| matches!(s, Seen::Status(m) if m.stage == MachineStage::Rebooting as i32)),
        "the machine status follows the sequence"
    );

    // Resuming after the last id seen gives the new boot from its start, up to ready.
    let tail = events.last().expect("events").id.clone();
    let client = admin(&b, node.addr()).await;
    let mut resumed = machine(&client)
        .events(EventsRequest {
            tail_id: tail,
            ..Default::default()
        })
        .await
        .expect("events")
        .into_inner();
    resumed.message().await.expect("hello").expect("hello");
    let first = resumed.message().await.expect("event").expect("event");
    assert!(
        matches!(decode(&first), Seen::Sequence(s) if s.sequence == "initialize" && s.action == 1),
        "{:?}",
        decode(&first)
    );
    let ready = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(event)) = resumed.message().await {
            if let Seen::Status(s) = decode(&event)
                && s.stage == MachineStage::Running as i32
                && s.status.is_some_and(|s| s.ready)
            {
                return true;
            }
        }
        false
    })
    .await;
    assert_eq!(ready, Ok(true), "the new boot becomes ready");
    assert_ne!(boot_id(&client).await, before, "a new boot id");
    node.stop().await;
}

#[tokio::test]
async fn a_reset_without_reboot_powers_off_until_powered_on() {
    let b = bundle_for(93);
    let node = ready_control_plane(&b, 11).await;
    let client = admin(&b, node.addr()).await;
    let mut stream = machine(&client)
        .events(EventsRequest::default())
        .await
        .expect("events")
        .into_inner();
    stream.message().await.expect("hello");
    machine(&client)
        .reset(ResetRequest {
            graceful: false,
            reboot: false,
            system_partitions_to_wipe: ["STATE", "EPHEMERAL"]
                .map(|label| ResetPartitionSpec {
                    label: label.into(),
                    wipe: true,
                })
                .to_vec(),
            ..Default::default()
        })
        .await
        .expect("reset");
    let seen: Vec<Seen> = drain(&mut stream).await.iter().map(decode).collect();
    let stop_all = seen
        .iter()
        .position(|s| matches!(s, Seen::Task(t) if t.task == "stopAllServices"));
    let shutdown = seen
        .iter()
        .position(|s| matches!(s, Seen::Task(t) if t.task == "shutdown"));
    assert!(
        stop_all.is_some() && shutdown > stop_all,
        "services stop, then the shutdown task: {seen:?}"
    );
    assert!(
        seen.iter()
            .any(|s| matches!(s, Seen::Restart(r) if r.cmd == 0x4321_fedc)),
        "power off: {seen:?}"
    );
    // The reset's end is where the simulator brings a node back or leaves it off: once the
    // node is reported powered off, that decision is made, and an unpowered node does not boot.
    eventually("powered off (or back)", WAIT, || async {
        !node.is_powered().await || node.is_serving().await
    })
    .await;
    assert!(!node.is_serving().await, "it stays off");
    node.restart().await.expect("power on");
    TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("back in maintenance")
        .version()
        .await
        .expect("version");
    node.stop().await;
}

/// Calls one method with `role`; `Ok` when machined's rules let it through.
async fn call(client: &TalosClient, method: &str) -> Result<(), tonic::Status> {
    let mut m = machine(client);
    match method {
        "Version" => m.version(()).await.map(drop),
        "ServiceList" => m.service_list(()).await.map(drop),
        "EtcdStatus" => m.etcd_status(()).await.map(drop),
        "EtcdDefragment" => m.etcd_defragment(()).await.map(drop),
        "Events" => m.events(EventsRequest::default()).await.map(drop),
        "Read" => {
            let mut s = m
                .read(ReadRequest {
                    path: BOOT_ID.into(),
                })
                .await?
                .into_inner();
            s.message().await.map(drop)
        }
        "Reboot" => m
            .reboot(RebootRequest {
                mode: 2, // FORCE: the reader and backup refusals are what is under test
            })
            .await
            .map(drop),
        "Reset" => m.reset(ResetRequest::default()).await.map(drop),
        other => panic!("no call for {other}"),
    }
}

#[tokio::test]
async fn each_role_may_call_what_machined_allows_it() {
    let b = bundle_for(94);
    let node = ready_control_plane(&b, 12).await;
    // (method, reader, operator, etcd backup), from machined's rules (talos-facts §10.6).
    let table = [
        ("Version", true, true, false),
        ("ServiceList", true, true, false),
        ("EtcdStatus", true, true, true),
        ("EtcdDefragment", false, true, false),
        ("Events", true, true, false),
        ("Read", false, false, false),
        ("Reset", false, false, false),
        ("Reboot", false, true, false),
    ];
    for (index, role) in [
        TalosRole::Reader,
        TalosRole::Operator,
        TalosRole::EtcdBackup,
    ]
    .into_iter()
    .enumerate()
    {
        let client = TalosClient::connect(&node.addr().to_string(), &credentials(&b, role))
            .await
            .expect("connect");
        for (method, reader, operator, backup) in table {
            let allowed = [reader, operator, backup][index];
            if method == "Reboot" && allowed {
                continue; // allowed, and would take the node down for the other rows
            }
            match call(&client, method).await {
                Ok(()) => assert!(allowed, "{role:?} may not call {method}"),
                Err(status) => {
                    assert!(!allowed, "{role:?} calling {method}: {status}");
                    assert_eq!(status.code(), tonic::Code::PermissionDenied, "{method}");
                    assert_eq!(status.message(), "not authorized");
                }
            }
        }
    }
    let operator = TalosClient::connect(
        &node.addr().to_string(),
        &credentials(&b, TalosRole::Operator),
    )
    .await
    .expect("connect");
    call(&operator, "Reboot").await.expect("operators reboot");
    node.stop().await;
}

/// A unary call to any path, for methods outside `proto/`.
async fn raw(channel: Channel, path: &'static str) -> tonic::Status {
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.expect("ready");
    grpc.unary::<(), (), _>(
        tonic::Request::new(()),
        tonic::codegen::http::uri::PathAndQuery::from_static(path),
        tonic_prost::ProstCodec::default(),
    )
    .await
    .expect_err("not served")
}

#[tokio::test]
async fn unsimulated_methods_say_so_after_the_role_check() {
    let b = bundle_for(95);
    let node = ready_control_plane(&b, 13).await;
    let client = admin(&b, node.addr()).await;
    for path in [
        "/machine.MachineService/Dmesg",
        "/machine.MachineService/Kubeconfig",
        "/cluster.ClusterService/HealthCheck",
        "/no.Such/Method",
    ] {
        let status = raw(client.channel(), path).await;
        assert_eq!(status.code(), tonic::Code::Unimplemented, "{path}");
        assert!(
            status.message().contains(path) && status.message().contains("not simulated"),
            "{path}: {}",
            status.message()
        );
    }
    let reader = TalosClient::connect(
        &node.addr().to_string(),
        &credentials(&b, TalosRole::Reader),
    )
    .await
    .expect("connect");
    let status = raw(reader.channel(), "/machine.MachineService/Kubeconfig").await;
    assert_eq!(
        status.code(),
        tonic::Code::PermissionDenied,
        "roles come first"
    );
    node.stop().await;
}

#[tokio::test]
async fn version_and_services_are_filled_as_machined_fills_them() {
    let maintenance = SimNode::start(addr(14), "v1.14.1").await.expect("start");
    let pinned = TalosClient::connect_maintenance(
        &maintenance.addr().to_string(),
        &maintenance.fingerprint(),
    )
    .await
    .expect("pinned");
    let reply = machine(&pinned)
        .version(())
        .await
        .expect("version")
        .into_inner();
    let version = reply.messages[0].version.clone().expect("version");
    assert_eq!(
        (
            version.tag.as_str(),
            version.sha.as_str(),
            version.go_version.as_str()
        ),
        ("v1.14.1", "2f86b9d2", "go1.26.8")
    );
    assert_eq!(
        (version.os.as_str(), version.arch.as_str()),
        ("linux", "amd64")
    );
    assert_eq!(version.built, "", "Talos leaves it empty");
    assert!(
        reply.messages[0].features.is_none(),
        "no features without a config"
    );
    maintenance.stop().await;

    let b = bundle_for(96);
    let node = ready_control_plane(&b, 15).await;
    let client = admin(&b, node.addr()).await;
    let reply = machine(&client)
        .version(())
        .await
        .expect("version")
        .into_inner();
    assert_eq!(reply.messages[0].features.map(|f| f.rbac), Some(true));
    let services = machine(&client)
        .service_list(())
        .await
        .expect("services")
        .into_inner()
        .messages
        .remove(0)
        .services;
    let ids: Vec<&str> = services.iter().map(|s| s.id.as_str()).collect();
    let mut sorted = ids.clone();
    sorted.sort_unstable();
    assert_eq!(ids, sorted, "sorted by id");
    let etcd = services.iter().find(|s| s.id == "etcd").expect("etcd");
    let events = &etcd.events.as_ref().expect("events").events;
    assert_eq!(events[0].msg, "Starting service");
    assert!(events.iter().all(|e| e.ts.is_some_and(|t| t.seconds > 0)));
    eventually("etcd healthy", WAIT, || {
        let client = client.clone();
        async move {
            let services = machine(&client)
                .service_list(())
                .await
                .expect("services")
                .into_inner()
                .messages
                .remove(0)
                .services;
            services.iter().any(|s| {
                s.id == "etcd"
                    && s.health
                        .as_ref()
                        .is_some_and(|h| h.healthy && h.last_change.is_some_and(|t| t.seconds > 0))
            })
        }
    })
    .await;
    let dashboard = services
        .iter()
        .find(|s| s.id == "dashboard")
        .expect("dashboard");
    assert!(
        dashboard.health.as_ref().is_some_and(|h| h.unknown),
        "no health check: unknown"
    );
    node.stop().await;
}

#[tokio::test]
async fn a_config_applied_in_maintenance_continues_the_same_boot_and_its_events() {
    let b = bundle_for(97);
    let node = SimNode::start(addr(16), "v1.14.1").await.expect("start");
    let pinned = TalosClient::connect_maintenance(&node.addr().to_string(), &node.fingerprint())
        .await
        .expect("pinned");
    let config = node_config(
        &b,
        &NodeConfig {
            role: Role::ControlPlane,
            talos_version: "v1.14.1",
            endpoint_host: &addr(16).ip().to_string(),
            hostname: Some("cp-1"),
            cni: "flannel",
            install: false,
        },
    );
    // Without an install document the node installs nothing and boots on in place
    // (talos-facts §5); Ichor's 1.14 render always carries one, so drop it here.
    let config = config
        .split("\n---\n")
        .filter(|d| !d.contains("kind: UnattendedInstallConfig"))
        .collect::<Vec<_>>()
        .join("\n---\n");
    pinned
        .apply_configuration(config.as_bytes(), ichor_talos::ApplyMode::Auto)
        .await
        .expect("apply");
    let client = admin(&b, node.addr()).await;
    let mut stream = machine(&client)
        .events(EventsRequest {
            tail_events: -1,
            ..Default::default()
        })
        .await
        .expect("events")
        .into_inner();
    stream.message().await.expect("hello");
    let mut maintenance = Vec::new();
    let booted = tokio::time::timeout(Duration::from_secs(10), async {
        while let Ok(Some(event)) = stream.message().await {
            match decode(&event) {
                Seen::Task(t) if t.task == "runningMaintenance" => maintenance.push(t.action),
                Seen::Sequence(s) if s.sequence == "boot" && s.action == 2 => return true,
                _ => {}
            }
        }
        false
    })
    .await;
    assert_eq!(booted, Ok(true), "the boot sequence ends");
    assert_eq!(
        maintenance,
        [0, 1],
        "the same boot's log: maintenance started, then ended by the config"
    );
    assert!(
        tokio::time::timeout(Duration::from_millis(300), stream.message())
            .await
            .is_err(),
        "the stream stays open for what comes next"
    );
    node.stop().await;
}
