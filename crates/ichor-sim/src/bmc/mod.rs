//! A simulated machine's BMC: a Redfish service over HTTPS on loopback whose power and boot
//! actions reach the simulated node. Opt-in per node ([`crate::NodeSpec::bmc`]).
//!
//! What lives here: the service (`http`: routing, authentication, headers, ETags, request
//! bounds; `resources`: the Redfish resources; `actions`: power, boot override, virtual
//! media; `accounts`: the account writes), its accounts and sessions (`sessions`), its error
//! responses (`errors`) and the
//! machine's firmware settings (`firmware`). What does not: the node's boot, which only asks
//! the firmware where to boot from (`Node::boot`).
//!
//! The service, as DSP0266 (the Redfish specification) and the DMTF schemas describe it:
//!
//! - Resources: `/redfish` (`{"v1": "/redfish/v1/"}`), the service root `/redfish/v1/`
//!   (`RedfishVersion`, `UUID`, links), the OData service document `/redfish/v1/odata` and
//!   `$metadata` (an `EntityContainer` over the DMTF CSDL of every type served), one
//!   `ComputerSystem` (`/redfish/v1/Systems/system`: `UUID`, `PowerState`, `Status`, `Boot`
//!   with the override's `@Redfish.AllowableValues`, `#ComputerSystem.Reset`), one `Manager`
//!   (`/redfish/v1/Managers/bmc`) with a `VirtualMedia` CD (`Cd`: `#VirtualMedia.InsertMedia`,
//!   `#VirtualMedia.EjectMedia`), `SessionService` with `Sessions`, and an `AccountService`
//!   (the account the BMC was set up with, an `Administrator`; accounts made, changed and
//!   deleted under the three predefined roles' privileges, 403 without them).
//! - Every response carries `OData-Version: 4.0`; a request naming another `OData-Version` is
//!   refused with 412. Reads carry `ETag` (also as `@odata.etag`), `Allow`, `Cache-Control` and a `Link` to the
//!   resource's DMTF JSON schema (`rel=describedby`); `If-None-Match` with the current ETag
//!   gives 304. A `PATCH` with `If-Match` of another ETag is refused with 412; a check and its
//!   write are one step, so of concurrent writes with one ETag one wins.
//! - Errors are Redfish error bodies (`error.code`, `error.message`,
//!   `@Message.ExtendedInfo` with Base registry messages): 401 with `WWW-Authenticate` without
//!   valid credentials (before anything else is looked at), 404, 405 with `Allow`, 400 naming
//!   each unknown, read-only or invalid property or action parameter (nothing is changed),
//!   400 `NoOperation` for a `PATCH` of annotations only, 412, 413 past 64 KiB of body, 501
//!   for a `$` query parameter (none is supported; others are ignored).
//! - Authentication: HTTP basic with an account's credentials, or a session's `X-Auth-Token`. The service root, `/redfish`, `odata`, `$metadata` and the session login
//!   need none.
//!
//! What the actions do to the node:
//!
//! - `ForceOff`: the node stops at once and answers nothing (as [`crate::SimNode::crash`]).
//!   `GracefulShutdown`: the ACPI power button, on which machined runs its shutdown sequence
//!   with `force` and powers off (talos-facts §15.3); a machine with nothing running (a halted
//!   boot, nothing bootable) ignores it.
//! - `On`: a powered-off machine boots through its firmware. `ForceRestart` and `PowerCycle`:
//!   off at once and on again after the reboot time. `GracefulRestart`: the power button,
//!   then on again once the machine is off.
//! - A boot through the firmware (a power-on, or a reboot that is no kexec: talos-facts §9.6)
//!   starts from the virtual CD when the override targets `Cd` (or there is no override and
//!   the disk has no Talos installed) and an image is inserted; otherwise from the disk as
//!   after any restart. A `Once` override is consumed by that boot (`BootSourceOverrideEnabled`
//!   back to `Disabled`). Booted from the CD, the machine runs the Talos version the ISO's URL
//!   names (talos-facts §15.1) in maintenance mode, and reports the ISO's schematic as its
//!   extensions; a machine whose disk has Talos installed halts instead, as the ISO's
//!   `talos.halt_if_installed=1` makes it (talos-facts §15.2): powered on, answering nothing.
//!   A disk wiped of every partition is as blank: the CD boots it into maintenance.
//! - `InsertMedia` takes an Image Factory ISO URL of the node's factory
//!   (`<factory>/image/<schematic>/<version>/<platform>-<arch>.iso`); it is checked as a BMC
//!   downloading it would find it: not under the factory's URL is a connection failure (500),
//!   a schematic the factory does not know its 404 (400 here, as sushy-tools answers a failed
//!   download), a Talos version the simulator does not model (not 1.13 or 1.14) a 400.
//!
//! The system reports the node's SMBIOS UUID as Talos reports it (talos-facts §8.1), or, with
//! [`BmcSpec::swapped_uuid`], the same UUID with its first three fields byte-swapped: what a
//! BMC reports when it reads the SMBIOS table in the other byte order (talos-facts §8.6). Faults ([`BmcFault`]): a BMC that stops
//! answering, and one whose password changed.

mod accounts;
mod actions;
mod errors;
mod firmware;
mod http;
mod resources;
mod sessions;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose, SanType,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use tokio::sync::{Mutex, watch};
use tokio::task::JoinHandle;

pub(crate) use firmware::Firmware;

use crate::factory::{FactoryIso, SimFactory};
use crate::{Node, SimError, Stage};

/// What a node's BMC is set up with.
#[derive(Clone, PartialEq, Eq)]
pub struct BmcSpec {
    /// The address its Redfish service listens on (port 0 picks one).
    pub addr: SocketAddr,
    /// The account's user name.
    pub username: String,
    /// The account's password.
    pub password: String,
    /// Report the system's UUID with its first three fields byte-swapped (mixed-endian).
    pub swapped_uuid: bool,
    /// The machine starts powered off: known only by its BMC until something powers it on.
    pub powered_off: bool,
}

impl std::fmt::Debug for BmcSpec {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BmcSpec")
            .field("addr", &self.addr)
            .field("username", &self.username)
            .field("password", &"<redacted>")
            .field("swapped_uuid", &self.swapped_uuid)
            .field("powered_off", &self.powered_off)
            .finish()
    }
}

impl BmcSpec {
    /// A BMC on a free port of 127.0.0.1 with account `username` and `password`, reporting the
    /// UUID as SMBIOS does, its machine powered on.
    pub fn new(username: &str, password: &str) -> Self {
        Self {
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            username: username.to_owned(),
            password: password.to_owned(),
            swapped_uuid: false,
            powered_off: false,
        }
    }
}

/// A fault a test injects into a BMC.
#[derive(Clone, PartialEq, Eq)]
pub enum BmcFault {
    /// The BMC stops answering, until cleared: connections are accepted, requests never
    /// answered (then answered once cleared), as a hung BMC web server.
    Unresponsive(bool),
    /// The account's password becomes this one (its sessions end): the credentials a client
    /// was given no longer work.
    Password(String),
}

impl std::fmt::Debug for BmcFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Unresponsive(on) => f.debug_tuple("Unresponsive").field(on).finish(),
            Self::Password(_) => f.write_str("Password(<redacted>)"),
        }
    }
}

/// What the service's handlers share.
#[derive(Debug)]
pub(crate) struct Service {
    node: Weak<Mutex<Node>>,
    firmware: Arc<Firmware>,
    factory: SimFactory,
    logins: sessions::Logins,
    swapped_uuid: bool,
    /// The service root's `UUID` (and the manager's `ServiceEntryPointUUID`).
    service_uuid: String,
    /// The manager's `UUID`.
    manager_uuid: String,
    unresponsive: watch::Sender<bool>,
    requests: AtomicUsize,
}

/// The running HTTPS server, stopped with its last handle.
#[derive(Debug)]
struct Server {
    addr: SocketAddr,
    ca_pem: String,
    handle: axum_server::Handle<SocketAddr>,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.handle.shutdown();
        self.task.abort();
    }
}

/// A simulated node's running BMC ([`crate::SimNode::bmc`]). A clone is another handle to the
/// same BMC.
#[derive(Debug, Clone)]
pub struct SimBmc {
    service: Arc<Service>,
    server: Arc<Server>,
}

impl SimBmc {
    /// The Redfish service's base URL, e.g. `https://127.0.0.1:41234`.
    pub fn url(&self) -> String {
        format!("https://{}", self.server.addr)
    }

    /// The address it serves on.
    pub fn addr(&self) -> SocketAddr {
        self.server.addr
    }

    /// The PEM of the CA that signed its certificate (the trust a client is given).
    pub fn ca_pem(&self) -> String {
        self.server.ca_pem.clone()
    }

    /// The path of its one system, `/redfish/v1/Systems/system`.
    pub fn system_path(&self) -> &'static str {
        resources::SYSTEM
    }

    /// The path of its virtual CD, `/redfish/v1/Managers/bmc/VirtualMedia/Cd`.
    pub fn cd_path(&self) -> &'static str {
        resources::CD
    }

    /// Injects a fault.
    pub fn inject(&self, fault: BmcFault) {
        match fault {
            BmcFault::Unresponsive(on) => {
                self.service.unresponsive.send_replace(on);
            }
            BmcFault::Password(password) => self.service.logins.set_password(&password),
        }
    }

    /// How many requests reached it since it started, whatever became of them.
    pub fn requests(&self) -> usize {
        self.service.requests.load(Ordering::SeqCst)
    }

    /// Stops serving: connections are refused from now on.
    pub fn stop(&self) {
        self.server.handle.shutdown();
        self.server.task.abort();
    }
}

/// Starts the BMC of `node` as `spec` says, sharing `firmware` with it.
pub(crate) async fn start(
    spec: &BmcSpec,
    node: Weak<Mutex<Node>>,
    firmware: Arc<Firmware>,
    factory: SimFactory,
    system_uuid: &str,
) -> Result<SimBmc, SimError> {
    let listener = std::net::TcpListener::bind(spec.addr).map_err(|source| SimError::Serve {
        addr: spec.addr,
        source,
    })?;
    let addr = listener.local_addr().map_err(|source| SimError::Serve {
        addr: spec.addr,
        source,
    })?;
    let (ca_pem, tls) = tls_config(addr)?;
    let service = Arc::new(Service {
        node,
        firmware,
        factory,
        logins: sessions::Logins::new(&spec.username, &spec.password),
        swapped_uuid: spec.swapped_uuid,
        service_uuid: derived_uuid(system_uuid, "service root"),
        manager_uuid: derived_uuid(system_uuid, "manager"),
        unresponsive: watch::Sender::new(false),
        requests: AtomicUsize::new(0),
    });
    let app = http::router(Arc::clone(&service));
    let handle = axum_server::Handle::new();
    let server = axum_server::from_tcp_rustls(
        listener,
        axum_server::tls_rustls::RustlsConfig::from_config(Arc::new(tls)),
    )
    .map_err(|source| SimError::Serve { addr, source })?
    .handle(handle.clone());
    let task = tokio::spawn(async move {
        if let Err(error) = server.serve(app.into_make_service()).await {
            tracing::warn!(%error, "the simulated BMC stopped serving");
        }
    });
    Ok(SimBmc {
        service,
        server: Arc::new(Server {
            addr,
            ca_pem,
            handle,
            task,
        }),
    })
}

/// A CA and a server certificate it signs for `addr` (its IP and `localhost`), as rustls
/// serves it; returns the CA's PEM too.
fn tls_config(addr: SocketAddr) -> Result<(String, rustls::ServerConfig), SimError> {
    let ca_key = KeyPair::generate()?;
    let mut ca = CertificateParams::new(Vec::<String>::new())?;
    ca.distinguished_name
        .push(DnType::CommonName, "ichor-sim BMC CA");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca_cert = ca.self_signed(&ca_key)?;
    let issuer = Issuer::new(ca, ca_key);
    let key = KeyPair::generate()?;
    let mut leaf = CertificateParams::new(vec!["localhost".to_owned()])?;
    leaf.subject_alt_names.push(SanType::IpAddress(addr.ip()));
    leaf.distinguished_name
        .push(DnType::CommonName, "ichor-sim BMC");
    leaf.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
    leaf.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    let cert = leaf.signed_by(&key, &issuer)?;
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| SimError::TlsSetup(e.to_string()))?
        .with_no_client_auth()
        .with_single_cert(
            vec![
                cert.der().clone(),
                CertificateDer::from(ca_cert.der().to_vec()),
            ],
            PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(key.serialize_der())),
        )
        .map_err(|e| SimError::TlsSetup(e.to_string()))?;
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((ca_cert.pem(), config))
}

/// A UUID derived from the system's, stable for one machine: the service's own identities.
fn derived_uuid(system_uuid: &str, what: &str) -> String {
    let digest = ring::digest::digest(
        &ring::digest::SHA256,
        format!("ichor-sim BMC {what} of {system_uuid}").as_bytes(),
    );
    let mut bytes = [0_u8; 16];
    bytes.copy_from_slice(&digest.as_ref()[..16]);
    uuid::Builder::from_random_bytes(bytes)
        .into_uuid()
        .to_string()
}

/// `uuid` with its first three fields byte-swapped (talos-facts §8.6: SMBIOS 2.6 stores them
/// little-endian, and a BMC may read them in the other order). Anything not a UUID is returned
/// as it is.
pub(crate) fn swap_uuid(uuid: &str) -> String {
    let fields: Vec<&str> = uuid.split('-').collect();
    let well_formed = fields.len() == 5
        && [8, 4, 4, 4, 12]
            .iter()
            .zip(&fields)
            .all(|(len, f)| f.len() == *len && f.bytes().all(|b| b.is_ascii_hexdigit()));
    if !well_formed {
        return uuid.to_owned();
    }
    let swap = |field: &str| -> String {
        let pairs: Vec<&str> = (0..field.len())
            .step_by(2)
            .filter_map(|i| field.get(i..i + 2))
            .collect();
        pairs.into_iter().rev().collect()
    };
    format!(
        "{}-{}-{}-{}-{}",
        swap(fields[0]),
        swap(fields[1]),
        swap(fields[2]),
        fields[3],
        fields[4]
    )
}

/// The ISO a boot of `node` through its firmware starts from, if it has a BMC and the
/// firmware picks the virtual CD (module doc).
pub(crate) fn boot_device(node: &Node) -> Option<FactoryIso> {
    let disk_boots = node.installed && !node.bricked;
    node.firmware.as_ref()?.boot_device(disk_boots)
}

/// Starts `node`'s boot from `iso`; `false` when it halts there, as an ISO does on a machine
/// with Talos installed (`talos.halt_if_installed`, talos-facts §15.2): powered, answering
/// nothing. A disk wiped of every partition holds no config and nothing installed.
pub(crate) fn boot_from(node: &mut Node, iso: &FactoryIso) -> bool {
    if node.installed && !node.bricked {
        node.halted = true;
        node.stage = Stage::Booting;
        return false;
    }
    if node.bricked {
        node.bricked = false;
        node.installed = false;
        node.persisted = None;
        node.staged = None;
        node.unattended = None;
        node.installer = None;
        node.pending_version = None;
        node.pending_installer = None;
        node.config_in_memory = false;
        node.etcd = None;
        node.etcd_dir_written = false;
        node.etcd_recovery = None;
        node.images.clear();
    }
    node.talos_version.clone_from(&iso.version);
    node.shared.set_talos_version(&iso.version);
    node.iso = Some(iso.clone());
    true
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_three_fields_are_byte_swapped() {
        assert_eq!(
            swap_uuid("00112233-4455-6677-8899-aabbccddeeff"),
            "33221100-5544-7766-8899-aabbccddeeff"
        );
        assert_eq!(swap_uuid("not a uuid"), "not a uuid");
    }

    #[test]
    fn derived_uuids_are_stable_and_distinct() {
        let a = derived_uuid("5a1a0000-0000-4000-8000-000000000001", "manager");
        assert_eq!(
            a,
            derived_uuid("5a1a0000-0000-4000-8000-000000000001", "manager")
        );
        assert_ne!(
            a,
            derived_uuid("5a1a0000-0000-4000-8000-000000000001", "service root")
        );
        assert_eq!(a.len(), 36);
    }
}
