//! A real S3-compatible object store for the backup tests: SeaweedFS's `weed server` (master,
//! volume server, filer and S3 gateway in one process) on free loopback ports, in a temporary
//! folder, built from Go modules by `cargo xtask seaweedfs` (ADR 0025).
//!
//! The gateway knows two identities: one that may read, write, list and delete objects, and one
//! that may only read and list. Neither is an admin, and buckets are never created on upload
//! (`-s3.autoCreateBucket=false`), so a missing bucket stays missing, as on any production
//! store. Buckets are created through the filer ([`S3Server::create_bucket`]).
//!
//! A server can serve HTTPS with a certificate from its own CA ([`S3ServerBuilder::tls`]), and
//! can keep its data on a size-limited filesystem ([`S3ServerBuilder::size_limit`]): a tmpfs
//! mounted in a mount namespace of its own (`unshare`), to play a store that fills up.

use std::ffi::OsString;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use crate::control_plane::{start_process, stop_process, write};
use crate::pki::{self, CertAndKey};
use crate::ports::Starts;
use crate::process::{ChildSpec, Supervised, Watchdog};
use crate::{Error, assets};

/// Names the `weed` binary to run (set by `cargo xtask test`).
pub const WEED_BIN_ENV: &str = "ICHOR_WEED_BIN";

/// The `tools/seaweedfs/go.mod` these tests were built against; it names the folder `weed` is
/// cached in.
const SEAWEEDFS_GO_MOD: &str = include_str!(concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../tools/seaweedfs/go.mod"
));

/// How long the server may take to accept a bucket and serve S3.
const READY_TIMEOUT: Duration = Duration::from_secs(60);

/// The region the gateway answers for (SeaweedFS accepts any; clients must name one).
pub const REGION: &str = "us-east-1";

/// An access key and its secret.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The access key id.
    pub access_key: String,
    /// The secret access key.
    pub secret_key: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .finish_non_exhaustive()
    }
}

/// The `weed` binary: `ICHOR_WEED_BIN` when set, else where `cargo xtask seaweedfs` caches it.
pub fn weed_binary() -> PathBuf {
    if let Some(path) = std::env::var_os(WEED_BIN_ENV).filter(|v| !v.is_empty()) {
        return PathBuf::from(path);
    }
    let version = assets::required_version(SEAWEEDFS_GO_MOD, "github.com/seaweedfs/seaweedfs")
        .expect("tools/seaweedfs/go.mod requires github.com/seaweedfs/seaweedfs");
    assets::cache_root()
        .join(format!("seaweedfs-{version}"))
        .join("weed")
}

/// Options for starting an [`S3Server`].
#[derive(Debug, Clone, Default)]
pub struct S3ServerBuilder {
    tls: bool,
    size_limit_mib: Option<u64>,
}

impl S3ServerBuilder {
    /// Serves HTTPS with a certificate for `127.0.0.1` from a CA of the server's own
    /// ([`S3Server::ca_pem`]).
    pub fn tls(mut self) -> Self {
        self.tls = true;
        self
    }

    /// Keeps the server's data on a filesystem of `mib` MiB, so that writes fail once it fills.
    pub fn size_limit(mut self, mib: u64) -> Self {
        self.size_limit_mib = Some(mib);
        self
    }

    /// Starts the server and waits until its S3 gateway answers.
    pub async fn start(self) -> Result<S3Server, Error> {
        S3Server::launch(self).await
    }
}

/// A running SeaweedFS server with its S3 gateway; stopped (and its folder removed) on drop.
pub struct S3Server {
    process: Option<Supervised>,
    endpoint: String,
    filer: SocketAddr,
    writer: Credentials,
    reader: Credentials,
    ca: Option<CertAndKey>,
    _watchdog: Watchdog,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for S3Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Server")
            .field("endpoint", &self.endpoint)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

impl S3Server {
    /// Options for a server.
    pub fn builder() -> S3ServerBuilder {
        S3ServerBuilder::default()
    }

    /// Starts a plain-HTTP server with no size limit.
    pub async fn start() -> Result<Self, Error> {
        Self::builder().start().await
    }

    async fn launch(options: S3ServerBuilder) -> Result<Self, Error> {
        let weed = weed_binary();
        if !weed.is_file() {
            return Err(Error::Startup(format!(
                "{} not found: run `cargo xtask seaweedfs` to build it (or set {WEED_BIN_ENV})",
                weed.display()
            )));
        }
        let dir = tempfile::Builder::new()
            .prefix("ichor-s3-")
            .tempdir()
            .map_err(Error::io("create a temporary folder"))?;
        let root = dir.path().to_path_buf();
        let watchdog = Watchdog::start(&root).map_err(Error::io("start the watchdog"))?;
        let data = root.join("data");
        std::fs::create_dir_all(&data).map_err(Error::io("create the data folder"))?;

        let writer = Credentials {
            access_key: random_token("ICHORW"),
            secret_key: random_token(""),
        };
        let reader = Credentials {
            access_key: random_token("ICHORR"),
            secret_key: random_token(""),
        };
        write(&root.join("s3.json"), &identities_json(&writer, &reader))?;
        let ca = if options.tls {
            let ca = pki::new_ca()?;
            let serving = pki::loopback_server_cert(&ca, "seaweedfs-s3")?;
            write(&root.join("s3.crt"), &serving.cert_pem)?;
            write(&root.join("s3.key"), &serving.key_pem)?;
            Some(ca)
        } else {
            None
        };

        let mut server = Self {
            process: None,
            endpoint: String::new(),
            filer: SocketAddr::from(([127, 0, 0, 1], 0)),
            writer,
            reader,
            ca,
            _watchdog: watchdog,
            dir,
        };
        let mut starts = Starts::fresh("weed", Ports::COUNT);
        loop {
            let picked = starts.next().await?;
            match server
                .start_weed(&weed, &data, &Ports::from(&picked), &options)
                .await
            {
                Ok(()) => return Ok(server),
                Err(error) => starts.retry(error)?,
            }
        }
    }

    /// Starts weed on `ports` and waits until it serves; stops it again when it does not.
    async fn start_weed(
        &mut self,
        weed: &Path,
        data: &Path,
        ports: &Ports,
        options: &S3ServerBuilder,
    ) -> Result<(), Error> {
        let root = self.dir.path().to_path_buf();
        let args = weed_args(&root, data, ports, options.tls);
        let spec = match options.size_limit_mib {
            None => ChildSpec {
                program: weed.to_path_buf(),
                args,
                log: root.join("weed.log"),
                env: Vec::new(),
            },
            Some(mib) => size_limited(weed, data, mib, args, root.join("weed.log")),
        };
        let scheme = if options.tls { "https" } else { "http" };
        self.process = Some(start_process("weed", spec, &root)?);
        self.endpoint = format!("{scheme}://127.0.0.1:{}", ports.s3);
        self.filer = SocketAddr::from(([127, 0, 0, 1], ports.filer));
        let ready = self.wait_ready(ports.s3).await;
        if ready.is_err() {
            stop_process(&mut self.process, "weed", &root)?;
        }
        ready
    }

    /// Waits until the filer takes a directory (master, volume server and filer are up) and the
    /// S3 gateway serves. A connection to the S3 port alone proves nothing: another process
    /// may hold the port picked for it, and then weed's own bind fails and it exits, after
    /// `filer_up`. The gateway says it serves once its listener is bound (weed's
    /// `command/s3.go` logs "Start Seaweed S3 API Server … at http(s) port N" only after
    /// `NewIpAndLocalListeners` returned; a failed bind is fatal before it).
    async fn wait_ready(&mut self, s3_port: u16) -> Result<(), Error> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let log = self.dir.path().join("weed.log");
        loop {
            if let Some(process) = self.process.as_mut() {
                process.check_running().map_err(Error::Startup)?;
            }
            let filer_up = filer_mkdir(self.filer, "/buckets/").await.is_ok();
            let s3_up = s3_serving(&log, s3_port)
                && TcpStream::connect(("127.0.0.1", s3_port)).await.is_ok();
            if filer_up && s3_up {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(Error::Startup(format!(
                    "weed did not serve S3 within {READY_TIMEOUT:?}; last lines of its log:\n{}",
                    crate::process::log_tail(&self.dir.path().join("weed.log"), 30)
                )));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// The S3 endpoint, `http(s)://127.0.0.1:<port>`.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The credentials that may read, write, list and delete objects in every bucket.
    pub fn credentials(&self) -> &Credentials {
        &self.writer
    }

    /// Credentials that may only read and list.
    pub fn read_only_credentials(&self) -> &Credentials {
        &self.reader
    }

    /// The CA certificate (PEM) of a TLS server.
    pub fn ca_pem(&self) -> Option<&str> {
        self.ca.as_ref().map(|ca| ca.cert_pem.as_str())
    }

    /// The server's folder (its log is `weed.log`).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Creates a bucket (a directory under the filer's `/buckets`).
    pub async fn create_bucket(&self, name: &str) -> Result<(), Error> {
        filer_mkdir(self.filer, &format!("/buckets/{name}/"))
            .await
            .map_err(|err| Error::Startup(format!("create bucket {name}: {err}")))
    }

    /// Stops the server for good: its endpoint then refuses connections.
    pub fn stop(&mut self) {
        if let Some(mut process) = self.process.take() {
            process.kill();
        }
    }
}

/// The ports `weed server` listens on; each gRPC port is given, since the default (HTTP port +
/// 10000) may be taken.
struct Ports {
    master: u16,
    master_grpc: u16,
    volume: u16,
    volume_grpc: u16,
    filer: u16,
    filer_grpc: u16,
    s3: u16,
    s3_grpc: u16,
}

impl Ports {
    /// How many there are.
    const COUNT: usize = 8;

    /// The ports from [`COUNT`](Self::COUNT) picked ones.
    fn from(picked: &[u16]) -> Self {
        let port = |i: usize| picked.get(i).copied().unwrap_or(0);
        Self {
            master: port(0),
            master_grpc: port(1),
            volume: port(2),
            volume_grpc: port(3),
            filer: port(4),
            filer_grpc: port(5),
            s3: port(6),
            s3_grpc: port(7),
        }
    }
}

fn weed_args(root: &Path, data: &Path, ports: &Ports, tls: bool) -> Vec<OsString> {
    let p = |name: &str| root.join(name).display().to_string();
    let mut args = vec![
        "server".to_owned(),
        "-ip=127.0.0.1".to_owned(),
        "-ip.bind=127.0.0.1".to_owned(),
        format!("-dir={}", data.display()),
        format!("-master.port={}", ports.master),
        format!("-master.port.grpc={}", ports.master_grpc),
        "-master.telemetry=false".to_owned(),
        // Small volumes, so that a size-limited store can hold a few.
        "-master.volumeSizeLimitMB=64".to_owned(),
        format!("-volume.port={}", ports.volume),
        format!("-volume.port.grpc={}", ports.volume_grpc),
        "-volume.max=0".to_owned(),
        "-volume.preStopSeconds=0".to_owned(),
        "-filer".to_owned(),
        format!("-filer.port={}", ports.filer),
        format!("-filer.port.grpc={}", ports.filer_grpc),
        format!("-filer.localSocket={}", p("filer.sock")),
        "-s3".to_owned(),
        format!("-s3.port={}", ports.s3),
        format!("-s3.port.grpc={}", ports.s3_grpc),
        "-s3.port.iceberg=0".to_owned(),
        "-s3.port.lance=0".to_owned(),
        format!("-s3.localSocket={}", p("s3.sock")),
        format!("-s3.config={}", p("s3.json")),
        "-s3.autoCreateBucket=false".to_owned(),
    ];
    if tls {
        // With a certificate, the gateway's one port serves HTTPS.
        args.push(format!("-s3.cert.file={}", p("s3.crt")));
        args.push(format!("-s3.key.file={}", p("s3.key")));
    }
    args.into_iter().map(OsString::from).collect()
}

/// Runs weed in a mount namespace of its own in which `data` is a tmpfs of `mib` MiB.
fn size_limited(
    weed: &Path,
    data: &Path,
    mib: u64,
    args: Vec<OsString>,
    log: PathBuf,
) -> ChildSpec {
    let mut wrapped: Vec<OsString> = vec![
        "--mount".into(),
        "--propagation".into(),
        "private".into(),
        "sh".into(),
        "-c".into(),
        format!("mount -t tmpfs -o size={mib}m ichor-s3 \"$0\" && exec \"$@\"").into(),
        data.into(),
        weed.into(),
    ];
    wrapped.extend(args);
    ChildSpec {
        program: "unshare".into(),
        args: wrapped,
        log,
        env: Vec::new(),
    }
}

fn identities_json(writer: &Credentials, reader: &Credentials) -> String {
    let identity = |name: &str, creds: &Credentials, actions: &[&str]| {
        serde_json::json!({
            "name": name,
            "credentials": [{ "accessKey": creds.access_key, "secretKey": creds.secret_key }],
            "actions": actions,
        })
    };
    serde_json::json!({
        "identities": [
            identity("ichor-writer", writer, &["Read", "Write", "List", "Tagging"]),
            identity("ichor-reader", reader, &["Read", "List"]),
        ]
    })
    .to_string()
}

fn random_token(prefix: &str) -> String {
    use rand::Rng as _;
    let mut rng = rand::rng();
    let tail: String = (0..20)
        .map(|_| char::from(b"ABCDEFGHIJKLMNOPQRSTUVWXYZ234567"[rng.random_range(0..32)]))
        .collect();
    format!("{prefix}{tail}")
}

/// `POST <path>/` with no content type: the filer creates the directory (SeaweedFS
/// `weed/server/filer_server_handlers_write_autochunk.go`, `mkdir`). An existing directory
/// answers an error, which counts as success for `/buckets/`.
/// Whether weed's log says its S3 gateway serves on `port` (its listener bound).
fn s3_serving(log: &Path, port: u16) -> bool {
    let http = format!("at http port {port}");
    let https = format!("at https port {port}");
    std::fs::read_to_string(log).is_ok_and(|text| {
        text.lines().any(|line| {
            line.contains("Start Seaweed S3 API Server")
                && (line.trim_end().ends_with(&http) || line.trim_end().ends_with(&https))
        })
    })
}

async fn filer_mkdir(filer: SocketAddr, path: &str) -> Result<(), String> {
    let mut stream = TcpStream::connect(filer)
        .await
        .map_err(|err| format!("connect to the filer: {err}"))?;
    let request = format!(
        "POST {path} HTTP/1.1\r\nHost: {filer}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream
        .write_all(request.as_bytes())
        .await
        .map_err(|err| format!("send to the filer: {err}"))?;
    let mut reply = Vec::new();
    tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut reply))
        .await
        .map_err(|_| "the filer did not answer within 10 s".to_owned())?
        .map_err(|err| format!("read the filer's answer: {err}"))?;
    let reply = String::from_utf8_lossy(&reply);
    let status = reply.split_whitespace().nth(1).unwrap_or("");
    if status.starts_with('2') || (path == "/buckets/" && reply.contains("already exists")) {
        Ok(())
    } else {
        Err(format!(
            "the filer answered: {}",
            reply.lines().next().unwrap_or("nothing")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gateway_serves_once_its_own_port_is_logged() {
        let dir = tempfile::tempdir().expect("a folder");
        let log = dir.path().join("weed.log");
        assert!(!s3_serving(&log, 8333), "no log yet");
        let filer = "I1206 17:00:00.000000 filer.go:1 Start Seaweed Filer 4.0 at 127.0.0.1:8888\n";
        std::fs::write(&log, filer).expect("write");
        assert!(!s3_serving(&log, 8333), "the filer serves, not the gateway");
        let other =
            "I1206 17:00:01.000000 s3.go:591 Start Seaweed S3 API Server 4.0 at http port 18333\n";
        std::fs::write(&log, format!("{filer}{other}")).expect("write");
        assert!(!s3_serving(&log, 8333), "another port");
        let ours =
            "I1206 17:00:01.000000 s3.go:591 Start Seaweed S3 API Server 4.0 at http port 8333\n";
        std::fs::write(&log, format!("{filer}{ours}")).expect("write");
        assert!(s3_serving(&log, 8333));
        let tls =
            "I1206 17:00:01.000000 s3.go:547 Start Seaweed S3 API Server 4.0 at https port 8333\n";
        std::fs::write(&log, tls).expect("write");
        assert!(s3_serving(&log, 8333));
    }
}
