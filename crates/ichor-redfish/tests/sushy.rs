//! The client against a real Redfish service: sushy-tools' `sushy-emulator` with its fake
//! driver, over TLS with Basic authentication (`ichor_testenv::SushyEmulator`). Power, the
//! one-time boot, virtual media (which the emulator really downloads, from a loopback HTTP
//! server here), wrong credentials, an untrusted certificate, and a BMC that goes away or
//! hangs. The fake driver applies a power change 1 to 11 seconds after the reset, so power is
//! polled until it reads back.
#![warn(clippy::pedantic)]

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use axum::Router;
use axum::routing::get;
use ichor_redfish::{
    Bmc, BootEnabled, BootTarget, Credentials, Endpoint, Error, Health, Limits, PowerState,
    ResetType, Trust, smbios_uuid_matches,
};
use ichor_testenv::wait::{eventually, try_eventually};
use ichor_testenv::{FakeSystem, SushyEmulator};

/// How long a power change may take to read back (the fake driver lands it within 11 s).
const POWER_READ_BACK: Duration = Duration::from_secs(30);

async fn emulator(systems: Vec<FakeSystem>) -> SushyEmulator {
    let mut builder = SushyEmulator::builder();
    for system in systems {
        builder = builder.system(system);
    }
    builder.start().await.expect("start sushy-emulator")
}

fn endpoint(emulator: &SushyEmulator, password: &str, trust: Trust) -> Endpoint {
    Endpoint::new(
        emulator.endpoint(),
        Credentials::new(emulator.username(), password),
        trust,
    )
}

fn bmc(emulator: &SushyEmulator) -> Bmc {
    let trust = Trust::CaBundle(emulator.ca_pem().to_owned());
    Bmc::new(endpoint(emulator, emulator.password(), trust)).expect("a client")
}

/// A client whose calls give up after `limit`.
fn impatient_bmc(emulator: &SushyEmulator, limit: Duration, in_flight: usize) -> Bmc {
    let trust = Trust::CaBundle(emulator.ca_pem().to_owned());
    let limits = Limits {
        connect_timeout: limit,
        request_timeout: limit,
        max_in_flight: in_flight,
        ..Limits::default()
    };
    Bmc::new(endpoint(emulator, emulator.password(), trust).limits(limits)).expect("a client")
}

async fn power_of(bmc: &Bmc, system: &str) -> Option<PowerState> {
    bmc.system(system)
        .await
        .expect("read the system")
        .power_state
}

#[tokio::test]
async fn lists_systems_and_reads_their_uuid_state_and_boot() {
    let dell = FakeSystem::new("dell").uuid("4c4c4544-0042-3510-8052-b4c04f4b4e32");
    let other = FakeSystem::new("other").powered_on();
    let emulator = emulator(vec![dell.clone(), other.clone()]).await;
    let bmc = bmc(&emulator);

    let mut systems = bmc.systems().await.expect("list the systems");
    systems.sort();
    let mut expected = vec![dell.path(), other.path()];
    expected.sort();
    assert_eq!(systems, expected);

    let read = bmc.system(&dell.path()).await.expect("read the system");
    assert_eq!(read.odata_id, dell.path());
    let uuid = read.uuid.as_deref().expect("a UUID");
    assert!(smbios_uuid_matches(
        uuid,
        "4C4C4544-0042-3510-8052-B4C04F4B4E32"
    ));
    assert!(
        smbios_uuid_matches(uuid, "44454c4c-4200-1035-8052-b4c04f4b4e32"),
        "the first three fields byte-swapped, as some firmware reports them"
    );
    assert!(!smbios_uuid_matches(uuid, &other.uuid));
    assert_eq!(read.power_state, Some(PowerState::Off));
    assert_eq!(read.health, Some(Health::Ok));
    assert_eq!(read.state.as_deref(), Some("Enabled"));
    assert_eq!(read.boot.target.as_deref(), Some("Hdd"));
    let allowed = read.boot.allowed_targets.expect("listed boot targets");
    assert!(allowed.iter().any(|t| t == "Cd"), "{allowed:?}");
    let reset = read.reset.expect("a reset action");
    assert!(reset.target.ends_with("/Actions/ComputerSystem.Reset"));
    assert!(!read.managed_by.is_empty(), "a manager");

    let on = bmc.system(&other.path()).await.expect("read the other");
    assert_eq!(on.power_state, Some(PowerState::On));
}

#[tokio::test]
async fn power_actions_are_read_back() {
    let node = FakeSystem::new("node");
    let emulator = emulator(vec![node.clone()]).await;
    let bmc = bmc(&emulator);
    let system = node.path();

    bmc.reset(&system, ResetType::On).await.expect("power on");
    eventually("the system to read On", POWER_READ_BACK, || async {
        power_of(&bmc, &system).await == Some(PowerState::On)
    })
    .await;

    bmc.reset(&system, ResetType::ForceOff)
        .await
        .expect("force off");
    eventually("the system to read Off", POWER_READ_BACK, || async {
        power_of(&bmc, &system).await == Some(PowerState::Off)
    })
    .await;

    // The emulator lists its reset types; one it does not list is refused here, unsent.
    let unlisted = bmc
        .reset(&system, ResetType::PowerCycle)
        .await
        .expect_err("PowerCycle is not listed");
    assert_eq!(unlisted.reason(), "BmcUnsupported", "{unlisted}");
    assert!(unlisted.to_string().contains("ForceRestart"), "{unlisted}");
    assert_eq!(power_of(&bmc, &system).await, Some(PowerState::Off));
}

#[tokio::test]
async fn a_one_time_boot_from_cd_is_read_back() {
    let node = FakeSystem::new("node");
    let emulator = emulator(vec![node.clone()]).await;
    let bmc = bmc(&emulator);
    let system = node.path();

    bmc.set_boot_override(&system, BootTarget::Cd, BootEnabled::Once)
        .await
        .expect("boot from CD once");
    let boot = bmc.system(&system).await.expect("read back").boot;
    assert_eq!(boot.target.as_deref(), Some("Cd"));
    // sushy-tools' fake driver keeps every override (fakedriver.py ignores
    // BootSourceOverrideEnabled): the client reports what the service says.
    assert_eq!(boot.enabled.as_deref(), Some("Continuous"));

    let unlisted = bmc
        .set_boot_override(&system, BootTarget::Usb, BootEnabled::Once)
        .await
        .expect_err("Usb is not listed");
    assert_eq!(unlisted.reason(), "BmcUnsupported", "{unlisted}");
}

/// A loopback HTTP server with one image, `/talos.iso`, counting its downloads.
async fn image_server() -> (String, Arc<AtomicUsize>) {
    let downloads = Arc::new(AtomicUsize::new(0));
    let counted = downloads.clone();
    let app = Router::new().route(
        "/talos.iso",
        get(move || {
            let counted = counted.clone();
            async move {
                counted.fetch_add(1, Ordering::SeqCst);
                vec![0x43_u8; 64 * 1024]
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind the image server");
    let address = listener.local_addr().expect("its address");
    tokio::spawn(async move { axum::serve(listener, app).await });
    (format!("http://{address}"), downloads)
}

#[tokio::test]
async fn virtual_media_is_inserted_fetched_and_ejected() {
    let node = FakeSystem::new("node");
    let emulator = emulator(vec![node.clone()]).await;
    let bmc = bmc(&emulator);
    let (server, downloads) = image_server().await;
    let image = format!("{server}/talos.iso");

    let cd = bmc
        .find_optical_media(&node.path())
        .await
        .expect("a CD or DVD device");
    assert!(cd.is_optical());
    assert_eq!(cd.inserted, Some(false));
    assert_eq!(cd.image, None);

    bmc.insert_media(&cd.odata_id, &image)
        .await
        .unwrap_or_else(|err| panic!("insert: {err}\n{}", emulator.log_tail()));
    let inserted = bmc.virtual_media(&cd.odata_id).await.expect("read back");
    assert_eq!(inserted.image.as_deref(), Some(image.as_str()));
    assert_eq!(inserted.inserted, Some(true));
    assert_eq!(inserted.write_protected, Some(true));
    assert_eq!(downloads.load(Ordering::SeqCst), 1, "the BMC fetched it");

    bmc.insert_media(&cd.odata_id, &image)
        .await
        .expect("insert the same image again");
    assert_eq!(
        downloads.load(Ordering::SeqCst),
        1,
        "an image already inserted is not sent again"
    );

    bmc.eject_media(&cd.odata_id).await.expect("eject");
    let ejected = bmc.virtual_media(&cd.odata_id).await.expect("read back");
    assert_eq!(ejected.inserted, Some(false));
    assert_eq!(ejected.image, None);
    bmc.eject_media(&cd.odata_id)
        .await
        .expect("ejecting an empty drive does nothing");

    let missing = bmc
        .insert_media(&cd.odata_id, &format!("{server}/missing.iso"))
        .await
        .expect_err("an image the BMC cannot fetch");
    assert_eq!(missing.reason(), "BmcRefused", "{missing}");
    let Error::Refused { messages, .. } = &missing else {
        panic!("a refusal: {missing}");
    };
    assert!(
        messages
            .iter()
            .any(|m| m.contains("Cannot download virtual media")),
        "the BMC's own message: {messages:?}"
    );
}

#[tokio::test]
async fn wrong_credentials_are_unauthorized_and_never_echo_the_password() {
    let node = FakeSystem::new("node");
    let emulator = emulator(vec![node.clone()]).await;
    let wrong = "wrong-password-0f8e";
    let trust = Trust::CaBundle(emulator.ca_pem().to_owned());
    let bmc = Bmc::new(endpoint(&emulator, wrong, trust)).expect("a client");

    for err in [
        bmc.systems()
            .await
            .expect_err("the collection needs credentials"),
        bmc.system(&node.path())
            .await
            .expect_err("so does a system"),
        bmc.reset(&node.path(), ResetType::On)
            .await
            .expect_err("and a reset"),
    ] {
        assert_eq!(err.reason(), "BmcUnauthorized", "{err}");
        assert!(
            matches!(err, Error::Unauthorized { status: 401, .. }),
            "{err}"
        );
        for printed in [err.to_string(), format!("{err:?}")] {
            assert!(!printed.contains(wrong), "{printed}");
            assert!(printed.contains(emulator.username()), "{printed}");
        }
    }
    assert!(!format!("{bmc:?}").contains(wrong));
}

#[tokio::test]
async fn a_certificate_from_another_ca_is_untrusted_and_skipping_verification_is_explicit() {
    let node = FakeSystem::new("node");
    let emulator = emulator(vec![node.clone()]).await;
    let other_ca = ichor_testenv::pki::new_ca().expect("another CA");

    let strict = Bmc::new(endpoint(
        &emulator,
        emulator.password(),
        Trust::CaBundle(other_ca.cert_pem),
    ))
    .expect("a client");
    let err = strict.system(&node.path()).await.expect_err("not our CA");
    assert_eq!(err.reason(), "BmcCertificateUntrusted", "{err}");

    let insecure = Bmc::new(endpoint(
        &emulator,
        emulator.password(),
        Trust::InsecureSkipVerify,
    ))
    .expect("a client");
    insecure
        .system(&node.path())
        .await
        .expect("any certificate, by explicit choice");
}

#[tokio::test]
async fn a_bmc_that_went_away_is_unreachable_at_once() {
    let node = FakeSystem::new("node");
    let mut emulator = emulator(vec![node.clone()]).await;
    let limit = Duration::from_secs(10);
    let bmc = impatient_bmc(&emulator, limit, 2);
    bmc.system(&node.path()).await.expect("it answers first");

    emulator.stop();
    let started = Instant::now();
    let err = bmc.system(&node.path()).await.expect_err("it is gone");
    assert_eq!(err.reason(), "BmcUnreachable", "{err}");
    assert!(err.to_string().contains(emulator.endpoint()), "{err}");
    assert!(
        started.elapsed() < limit,
        "a refused connection fails at once, not at the time limit: {:?}",
        started.elapsed()
    );
    assert!(err.is_transient());
}

#[tokio::test]
async fn a_hung_bmc_is_unreachable_within_its_time_limit_and_holds_up_no_other() {
    let node = FakeSystem::new("hung");
    let healthy_node = FakeSystem::new("healthy");
    let hung = emulator(vec![node.clone()]).await;
    let healthy = emulator(vec![healthy_node.clone()]).await;
    let limit = Duration::from_secs(2);
    // One request in flight at a time: the second call waits for the first, and still gives
    // up within its own limit.
    let hung_bmc = impatient_bmc(&hung, limit, 1);
    let healthy_bmc = impatient_bmc(&healthy, limit, 1);
    hung_bmc
        .system(&node.path())
        .await
        .expect("it answers first");

    hung.freeze().expect("freeze the emulator");
    let started = Instant::now();
    let path = node.path();
    let (first, second, other) =
        tokio::join!(hung_bmc.system(&path), hung_bmc.system(&path), async {
            let read = healthy_bmc.system(&healthy_node.path()).await;
            (read, started.elapsed())
        });
    let took = started.elapsed();
    hung.thaw().expect("thaw the emulator");

    for err in [first.expect_err("hung"), second.expect_err("hung")] {
        assert_eq!(err.reason(), "BmcUnreachable", "{err}");
    }
    assert!(
        took < limit + Duration::from_secs(2),
        "both calls gave up within the limit: {took:?}"
    );
    let (read, healthy_took) = other;
    read.expect("the healthy BMC answers");
    assert!(
        healthy_took < limit,
        "the healthy BMC was not held up by the hung one: {healthy_took:?}"
    );

    // Once it answers again, so does the client.
    let back = try_eventually("the thawed BMC to answer", Duration::from_secs(20), || {
        hung_bmc.system(&path)
    })
    .await;
    back.expect("the BMC answers again");
}
