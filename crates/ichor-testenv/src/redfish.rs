//! A real Redfish service for the BMC tests: sushy-tools' `sushy-emulator` (PyPI, the emulator
//! OpenStack Ironic is tested against) with its fake driver, which plays computer systems
//! without any virtual machine, served over HTTPS with HTTP Basic authentication on a free
//! loopback port, from a temporary folder, and stopped on drop (ADR 0079).
//!
//! The tools (`sushy-emulator`, and a `python` that imports `sushy` and the DMTF's
//! `redfish_protocol_validator`) are one virtual environment that `cargo xtask redfish-tools`
//! installs from `tools/redfish/requirements.txt`; `cargo xtask test` hands its `bin` folder
//! to the tests as `ICHOR_REDFISH_TOOLS`. Without it a test fails, naming the variable.
//!
//! What the fake driver does, as sushy-tools 2.2.0 writes it
//! (`sushy_tools/emulator/resources/systems/fakedriver.py`): a power change is not immediate
//! but lands 1 to 11 seconds after the reset, seen on the next read, so a test polls
//! `PowerState`; `BootSourceOverrideEnabled` always reads `Continuous` whatever was set; a
//! system is addressed by its UUID (`/redfish/v1/Systems/<uuid>`). Its state lives in the
//! emulator's folder (`SUSHY_EMULATOR_STATE_DIR`), so no two emulators share it, and the images
//! virtual media downloads go to the folder's `tmp` (`TMPDIR`).

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use tokio::io::AsyncWriteExt as _;
use tokio::net::TcpStream;

use crate::Error;
use crate::control_plane::{start_process, stop_process, write};
use crate::pki::{self, CertAndKey};
use crate::ports::Starts;
use crate::process::{ChildSpec, Supervised, Watchdog};

/// Names the folder holding `sushy-emulator` and the `python` of the Redfish tools' virtual
/// environment (set by `cargo xtask test`; `cargo xtask redfish-tools` prints it).
pub const REDFISH_TOOLS_ENV: &str = "ICHOR_REDFISH_TOOLS";

/// How long the emulator may take to serve.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The user the emulator's password file holds.
const USERNAME: &str = "ichor";

/// The Redfish tools' folder from [`REDFISH_TOOLS_ENV`], checked to hold `sushy-emulator` and
/// `python`.
pub fn redfish_tools() -> Result<PathBuf, Error> {
    tools_in(std::env::var_os(REDFISH_TOOLS_ENV))
}

/// The tools' folder the variable names (`None`: unset), checked.
fn tools_in(value: Option<OsString>) -> Result<PathBuf, Error> {
    let Some(dir) = value.filter(|v| !v.is_empty()) else {
        return Err(Error::MissingTool(format!(
            "{REDFISH_TOOLS_ENV} is not set: run `cargo xtask redfish-tools` and set \
             {REDFISH_TOOLS_ENV} to the folder it prints last (`cargo xtask test` sets it)"
        )));
    };
    let dir = PathBuf::from(dir);
    for tool in ["sushy-emulator", "python"] {
        if !dir.join(tool).is_file() {
            return Err(Error::MissingTool(format!(
                "{REDFISH_TOOLS_ENV}={} holds no {tool}: run `cargo xtask redfish-tools` and set \
                 {REDFISH_TOOLS_ENV} to the folder it prints last",
                dir.display()
            )));
        }
    }
    Ok(dir)
}

/// A computer system the fake driver plays.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FakeSystem {
    /// Its UUID, which is also its id in the emulator's paths.
    pub uuid: String,
    /// Its name.
    pub name: String,
    /// Its power state at start: `On` or `Off`.
    pub power_state: String,
}

impl FakeSystem {
    /// A system called `name` with a fresh random UUID, powered off.
    pub fn new(name: &str) -> Self {
        Self {
            uuid: random_uuid(),
            name: name.to_owned(),
            power_state: "Off".to_owned(),
        }
    }

    /// The same system, with this UUID.
    #[must_use]
    pub fn uuid(mut self, uuid: &str) -> Self {
        uuid.clone_into(&mut self.uuid);
        self
    }

    /// The same system, powered on at start.
    #[must_use]
    pub fn powered_on(mut self) -> Self {
        "On".clone_into(&mut self.power_state);
        self
    }

    /// Its path on the emulator.
    pub fn path(&self) -> String {
        format!("/redfish/v1/Systems/{}", self.uuid)
    }
}

/// Options for starting a [`SushyEmulator`].
#[derive(Debug, Clone, Default)]
pub struct SushyEmulatorBuilder {
    systems: Vec<FakeSystem>,
}

impl SushyEmulatorBuilder {
    /// Adds a system (without any, the emulator plays one powered-off system, `fake`).
    #[must_use]
    pub fn system(mut self, system: FakeSystem) -> Self {
        self.systems.push(system);
        self
    }

    /// Starts the emulator and waits until it serves.
    pub async fn start(self) -> Result<SushyEmulator, Error> {
        SushyEmulator::launch(self).await
    }
}

/// A running `sushy-emulator`; stopped (and its folder removed) on drop.
pub struct SushyEmulator {
    process: Option<Supervised>,
    endpoint: String,
    password: String,
    ca: CertAndKey,
    systems: Vec<FakeSystem>,
    _watchdog: Watchdog,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for SushyEmulator {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SushyEmulator")
            .field("endpoint", &self.endpoint)
            .field("systems", &self.systems)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl SushyEmulator {
    /// Options for an emulator.
    pub fn builder() -> SushyEmulatorBuilder {
        SushyEmulatorBuilder::default()
    }

    async fn launch(options: SushyEmulatorBuilder) -> Result<Self, Error> {
        let tools = redfish_tools()?;
        let dir = tempfile::Builder::new()
            .prefix("ichor-redfish-")
            .tempdir()
            .map_err(Error::io("create a temporary folder"))?;
        let root = dir.path().to_path_buf();
        let watchdog = Watchdog::start(&root).map_err(Error::io("start the watchdog"))?;
        for folder in ["state", "tmp"] {
            std::fs::create_dir_all(root.join(folder))
                .map_err(Error::io(format!("create the emulator's {folder} folder")))?;
        }
        let password = random_password();
        write(
            &root.join("htpasswd"),
            &format!("{USERNAME}:{}\n", bcrypt(&tools, &password).await?),
        )?;
        let ca = pki::new_ca()?;
        let serving = pki::loopback_server_cert(&ca, "sushy-emulator")?;
        write(&root.join("bmc.crt"), &serving.cert_pem)?;
        write(&root.join("bmc.key"), &serving.key_pem)?;
        let systems = if options.systems.is_empty() {
            vec![FakeSystem::new("fake")]
        } else {
            options.systems
        };
        let mut emulator = Self {
            process: None,
            endpoint: String::new(),
            password,
            ca,
            systems,
            _watchdog: watchdog,
            dir,
        };
        let mut starts = Starts::fresh("sushy-emulator", 1);
        loop {
            let picked = starts.next().await?;
            let port = picked.first().copied().unwrap_or(0);
            match emulator.start_on(&tools, port).await {
                Ok(()) => return Ok(emulator),
                Err(error) => starts.retry(error)?,
            }
        }
    }

    /// Starts the emulator on `port` and waits until it serves; stops it again when it does
    /// not.
    async fn start_on(&mut self, tools: &Path, port: u16) -> Result<(), Error> {
        let root = self.dir.path().to_path_buf();
        let config = root.join("emulator.conf");
        write(&config, &config_file(&root, port, &self.systems))?;
        let spec = ChildSpec {
            program: tools.join("sushy-emulator"),
            args: vec![OsString::from("--config"), config.into_os_string()],
            log: root.join("sushy-emulator.log"),
            env: vec![
                ("TMPDIR".into(), root.join("tmp").into_os_string()),
                ("PYTHONUNBUFFERED".into(), "1".into()),
                // The images virtual media fetches are served on loopback: never via a proxy.
                ("NO_PROXY".into(), "127.0.0.1,localhost".into()),
                ("no_proxy".into(), "127.0.0.1,localhost".into()),
            ],
        };
        self.process = Some(start_process("sushy-emulator", spec, &root)?);
        self.endpoint = format!("https://127.0.0.1:{port}");
        let ready = self.wait_ready(port).await;
        if ready.is_err() {
            stop_process(&mut self.process, "sushy-emulator", &root)?;
        }
        ready
    }

    /// Waits until the emulator says it serves on `port` (werkzeug logs ` * Running on
    /// https://127.0.0.1:<port>` once its socket is bound and listening) and that port takes a
    /// connection. Another process holding the port makes the emulator exit instead.
    async fn wait_ready(&mut self, port: u16) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let log = self.dir.path().join("sushy-emulator.log");
        let banner = format!("Running on https://127.0.0.1:{port}");
        loop {
            if let Some(process) = self.process.as_mut() {
                process.check_running().map_err(Error::Startup)?;
            }
            let said = std::fs::read_to_string(&log).is_ok_and(|text| text.contains(&banner));
            if said && TcpStream::connect(("127.0.0.1", port)).await.is_ok() {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Startup(format!(
                    "sushy-emulator did not serve within {READY_TIMEOUT:?}; last lines of its log:\n{}",
                    crate::process::log_tail(&log, 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The Redfish endpoint, `https://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The CA certificate (PEM) that signed the emulator's serving certificate (for
    /// `127.0.0.1` and `localhost`).
    pub fn ca_pem(&self) -> &str {
        &self.ca.cert_pem
    }

    /// The user the emulator accepts.
    pub fn username(&self) -> &str {
        USERNAME
    }

    /// That user's password.
    pub fn password(&self) -> &str {
        &self.password
    }

    /// The systems it plays.
    pub fn systems(&self) -> &[FakeSystem] {
        &self.systems
    }

    /// The emulator's folder (its log is `sushy-emulator.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The last lines of the emulator's log, for a failing test's message.
    pub fn log_tail(&self) -> String {
        crate::process::log_tail(&self.dir.path().join("sushy-emulator.log"), 40)
    }

    /// Freezes the emulator (`SIGSTOP`): its port still takes connections, which the kernel
    /// queues, but nothing answers, as a hung BMC.
    pub fn freeze(&self) -> Result<(), Error> {
        self.signal(Signal::SIGSTOP)
    }

    /// Lets a frozen emulator run again (`SIGCONT`).
    pub fn thaw(&self) -> Result<(), Error> {
        self.signal(Signal::SIGCONT)
    }

    fn signal(&self, signal: Signal) -> Result<(), Error> {
        let process = self
            .process
            .as_ref()
            .ok_or_else(|| Error::Startup("sushy-emulator is not running".to_owned()))?;
        let pid = i32::try_from(process.pid())
            .map_err(|_| Error::Startup("sushy-emulator's pid is out of range".to_owned()))?;
        killpg(Pid::from_raw(pid), signal).map_err(|errno| Error::Io {
            action: format!("send {} to sushy-emulator", signal.as_str()),
            source: std::io::Error::from(errno),
        })
    }

    /// Stops the emulator for good: its endpoint then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

/// The emulator's configuration (a Python file Flask executes): loopback, TLS, the password
/// file, the fake driver with `systems`, and its state in `root`.
fn config_file(root: &Path, port: u16, systems: &[FakeSystem]) -> String {
    let path = |name: &str| python_string(&root.join(name).display().to_string());
    let systems: Vec<serde_json::Value> = systems
        .iter()
        .enumerate()
        .map(|(i, system)| {
            serde_json::json!({
                "uuid": system.uuid,
                "name": system.name,
                "power_state": system.power_state,
                "external_notifier": false,
                "nics": [{ "mac": format!("52:54:00:00:00:{:02x}", i % 256), "ip": "192.0.2.10" }],
            })
        })
        .collect();
    let systems = python_string(&serde_json::Value::Array(systems).to_string());
    format!(
        "# Written by ichor-testenv for one test's sushy-emulator.\n\
         import json\n\
         SUSHY_EMULATOR_LISTEN_IP = '127.0.0.1'\n\
         SUSHY_EMULATOR_LISTEN_PORT = {port}\n\
         SUSHY_EMULATOR_SSL_CERT = {cert}\n\
         SUSHY_EMULATOR_SSL_KEY = {key}\n\
         SUSHY_EMULATOR_AUTH_FILE = {auth}\n\
         SUSHY_EMULATOR_STATE_DIR = {state}\n\
         SUSHY_EMULATOR_FEATURE_SET = 'full'\n\
         SUSHY_EMULATOR_FAKE_DRIVER = True\n\
         SUSHY_EMULATOR_FAKE_SYSTEMS = json.loads({systems})\n",
        cert = path("bmc.crt"),
        key = path("bmc.key"),
        auth = path("htpasswd"),
        state = path("state"),
    )
}

/// `text` as a Python string literal: a JSON string is one (its escapes are Python's too).
fn python_string(text: &str) -> String {
    serde_json::Value::String(text.to_owned()).to_string()
}

/// `password`'s bcrypt hash (the only digest sushy-tools' password file takes), made by the
/// tools' own `bcrypt` at the lowest cost, since the emulator checks it on every request.
async fn bcrypt(tools: &Path, password: &str) -> Result<String, Error> {
    let mut child = tokio::process::Command::new(tools.join("python"))
        .args([
            "-c",
            "import sys, bcrypt; \
             sys.stdout.write(bcrypt.hashpw(sys.stdin.buffer.read(), bcrypt.gensalt(rounds=4)).decode())",
        ])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(Error::io("run the Redfish tools' python"))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(password.as_bytes())
            .await
            .map_err(Error::io("hand the password to bcrypt"))?;
    }
    let output = child
        .wait_with_output()
        .await
        .map_err(Error::io("hash the password with bcrypt"))?;
    let hash = String::from_utf8_lossy(&output.stdout).trim().to_owned();
    if !output.status.success() || !hash.starts_with("$2") {
        return Err(Error::Startup(format!(
            "bcrypt in the Redfish tools' python failed ({}): {}",
            output.status,
            String::from_utf8_lossy(&output.stderr)
        )));
    }
    Ok(hash)
}

fn random_password() -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    (0..24)
        .map(|_| char::from(b"abcdefghijkmnpqrstuvwxyz23456789"[rng.random_range(0..32)]))
        .collect()
}

/// A random (version 4) UUID, lowercase.
fn random_uuid() -> String {
    use rand::Rng as _;
    let mut bytes: [u8; 16] = rand::rng().random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_config_is_python_naming_each_file_of_the_folder() {
        let system = FakeSystem::new("node-1").uuid("27946b59-9e44-4fa7-8e91-f3527a1ef094");
        let text = config_file(Path::new("/tmp/ichor-redfish-x"), 8443, &[system]);
        assert!(text.contains("SUSHY_EMULATOR_LISTEN_PORT = 8443\n"));
        assert!(text.contains("SUSHY_EMULATOR_SSL_CERT = \"/tmp/ichor-redfish-x/bmc.crt\"\n"));
        assert!(text.contains("SUSHY_EMULATOR_STATE_DIR = \"/tmp/ichor-redfish-x/state\"\n"));
        assert!(text.contains("SUSHY_EMULATOR_FAKE_DRIVER = True\n"));
        assert!(text.contains("json.loads(\"[{"));
        assert!(text.contains("27946b59-9e44-4fa7-8e91-f3527a1ef094"));
    }

    #[test]
    fn random_uuids_are_version_four() {
        let uuid = random_uuid();
        assert_eq!(uuid.len(), 36);
        assert_eq!(uuid.as_bytes()[14], b'4');
        assert_ne!(uuid, random_uuid());
    }

    #[test]
    fn missing_tools_fail_naming_the_variable_and_the_task() {
        let empty = tempfile::tempdir().expect("a folder");
        for value in [None, Some(OsString::new()), Some(empty.path().into())] {
            let text = tools_in(value).expect_err("no tools").to_string();
            assert!(text.contains(REDFISH_TOOLS_ENV), "{text}");
            assert!(text.contains("cargo xtask redfish-tools"), "{text}");
        }
    }
}
