//! Loopback ports for the servers the tests start, and the one way every such server is
//! started: [`Starts`], fresh ports for a first start, the same ones for a restart (or a
//! server whose port is fixed).
//!
//! A port that was free when it was picked may be taken by another test before the server
//! binds it. The server then says so by exiting (etcd, kube-apiserver, weed, sushy-emulator) or
//! by failing to become ready; either way its start fails, and a failed start counts as a *lost
//! port* when, once the server is stopped, one of its ports is held by another process (our
//! own bind of it fails with [`std::io::ErrorKind::AddrInUse`]), or — when the other process
//! let go again meanwhile — its error reports `address already in use`. The servers are Go
//! programs (and one Python program) that report a failed bind only as text; that text is read
//! in one place, [`says_address_in_use`].
//! A lost port is retried up to [`ATTEMPTS`] times, on fresh ports or, for a restart, on the
//! same ones once they are free again; any other failure is returned at once.
//!
//! Servers that announce a port they chose themselves (`--port 0`, the manager's and the
//! webhook's `127.0.0.1:0`) need none of this and do not use it.

use std::fmt::Write as _;
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener};
use std::time::Duration;

use crate::Error;
use crate::wait::try_eventually;

/// How many times a server is started before a lost port is given up on.
pub const ATTEMPTS: usize = 5;

/// How long a restart waits for its ports to be free (the old process is gone by then; what
/// may still hold a port is another process).
const FREE_TIMEOUT: Duration = Duration::from_secs(30);

/// A port that was free on `ip` a moment ago.
pub fn pick(ip: IpAddr) -> Result<u16, Error> {
    let listener = TcpListener::bind((ip, 0)).map_err(Error::io(format!("bind a port on {ip}")))?;
    Ok(listener
        .local_addr()
        .map_err(Error::io("read a bound port"))?
        .port())
}

/// Whether another process holds `port` on `ip`: a bind of it fails with `AddrInUse`.
pub fn held(ip: IpAddr, port: u16) -> bool {
    matches!(TcpListener::bind((ip, port)), Err(err) if err.kind() == ErrorKind::AddrInUse)
}

/// Whether a server's error or log says that a port it was given was taken: the one place
/// log text stands for a failed bind (Go's `bind: address already in use`, Python's
/// `Address already in use`).
pub fn says_address_in_use(text: &str) -> bool {
    text.to_ascii_lowercase().contains("address already in use")
}

/// Whether a failed start of a server on `ports` of `ip` lost a port to another process. The
/// server must be stopped by then.
fn lost(ip: IpAddr, ports: &[u16], error: &Error) -> bool {
    ports.iter().any(|&port| held(ip, port)) || says_address_in_use(&format!("{error:?}"))
}

/// The error for a server that lost a port at every attempt.
fn given_up(server: &str, ip: IpAddr, tried: &[Vec<u16>], last: Error) -> Error {
    let mut ports = String::new();
    for (i, set) in tried.iter().enumerate() {
        let set: Vec<String> = set.iter().map(u16::to_string).collect();
        let _ = write!(
            ports,
            "{}{}",
            if i == 0 { "" } else { "; " },
            set.join(", ")
        );
    }
    Error::PortLost {
        server: server.to_owned(),
        attempts: tried.len(),
        ports: format!("{ip}: {ports}"),
        last: Box::new(last),
    }
}

/// A hook run between picking ports and starting the server (tests take a port there).
type AfterPick = Box<dyn FnMut(&[u16]) + Send>;

/// Which ports each start gets.
enum Choice {
    /// `count` ports picked fresh for each start.
    Fresh {
        count: usize,
        after_pick: Option<AfterPick>,
    },
    /// These ports, once they are free.
    Same(Vec<u16>),
}

/// The starts of one server: which ports each gets, and whether a failed one is tried again.
///
/// ```no_run
/// # use ichor_testenv::{Error, ports::Starts};
/// # async fn start_etcd_on(_ports: &[u16]) -> Result<(), Error> { Ok(()) }
/// # async fn example() -> Result<(), Error> {
/// let mut starts = Starts::fresh("etcd", 2);
/// let etcd = loop {
///     let ports = starts.next().await?;
///     match start_etcd_on(&ports).await {
///         Ok(etcd) => break etcd,
///         // Stop what the failed start left running first.
///         Err(error) => starts.retry(error)?,
///     }
/// };
/// # Ok(())
/// # }
/// ```
pub struct Starts {
    server: &'static str,
    ip: IpAddr,
    choice: Choice,
    tried: Vec<Vec<u16>>,
}

impl std::fmt::Debug for Starts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Starts")
            .field("server", &self.server)
            .field("ip", &self.ip)
            .field("tried", &self.tried)
            .finish_non_exhaustive()
    }
}

impl Starts {
    /// Starts of `server` on `count` ports of 127.0.0.1 picked fresh for each.
    pub fn fresh(server: &'static str, count: usize) -> Self {
        Self {
            server,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            choice: Choice::Fresh {
                count,
                after_pick: None,
            },
            tried: Vec::new(),
        }
    }

    /// Starts of `server` on `ports` of `ip`, each once they are free: a restart (its clients
    /// know the address) or a fixed endpoint.
    pub fn same(server: &'static str, ip: IpAddr, ports: &[u16]) -> Self {
        Self {
            server,
            ip,
            choice: Choice::Same(ports.to_vec()),
            tried: Vec::new(),
        }
    }

    /// Starts of `server` at `address`: on a fresh port of its IP when its port is 0, else on
    /// that port once it is free.
    pub fn at(server: &'static str, address: SocketAddr) -> Self {
        match address.port() {
            0 => Self::fresh(server, 1).on(address.ip()),
            port => Self::same(server, address.ip(), &[port]),
        }
    }

    /// Picks fresh ports on `ip` rather than 127.0.0.1.
    pub fn on(mut self, ip: IpAddr) -> Self {
        self.ip = ip;
        self
    }

    /// Runs `hook` with each start's fresh ports after they are picked and before the server
    /// starts: a test's way to take one of them, as another test would.
    pub fn after_pick(mut self, hook: impl FnMut(&[u16]) + Send + 'static) -> Self {
        if let Choice::Fresh { after_pick, .. } = &mut self.choice {
            *after_pick = Some(Box::new(hook));
        }
        self
    }

    /// The ports for the next start: fresh ones, or the same ones once no other process
    /// holds them.
    pub async fn next(&mut self) -> Result<Vec<u16>, Error> {
        let ports = match &mut self.choice {
            Choice::Fresh { count, after_pick } => {
                let ports = (0..*count)
                    .map(|_| pick(self.ip))
                    .collect::<Result<Vec<_>, _>>()?;
                if let Some(hook) = after_pick.as_mut() {
                    hook(&ports);
                }
                ports
            }
            Choice::Same(ports) => {
                wait_free(self.server, self.ip, ports).await?;
                ports.clone()
            }
        };
        self.tried.push(ports.clone());
        Ok(ports)
    }

    /// After a failed start (whose server is stopped by now): `Ok` when it lost a port and
    /// another start may be tried ([`ATTEMPTS`] in all), else the error to return.
    pub fn retry(&mut self, error: Error) -> Result<(), Error> {
        let Some(ports) = self.tried.last() else {
            return Err(error);
        };
        if !lost(self.ip, ports, &error) {
            return Err(error);
        }
        if self.tried.len() >= ATTEMPTS {
            return Err(given_up(self.server, self.ip, &self.tried, error));
        }
        tracing::info!(
            server = self.server,
            ?ports,
            "a port was taken before the server bound it; starting it again"
        );
        Ok(())
    }
}

/// Waits until no other process holds one of `ports` of `ip`.
async fn wait_free(server: &str, ip: IpAddr, ports: &[u16]) -> Result<(), Error> {
    let what = format!("{server}'s ports {ports:?} on {ip} to be free");
    try_eventually(&what, FREE_TIMEOUT, || async {
        match ports.iter().find(|&&port| held(ip, port)) {
            Some(port) => Err(format!(
                "{} is held by another process",
                SocketAddr::from((ip, *port))
            )),
            None => Ok(()),
        }
    })
    .await
    .map_err(|timeout| Error::Timeout(timeout.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::{Arc, Mutex};

    /// A "server" that binds every port it is given, failing as a Go server would.
    fn bind_all(ports: &[u16]) -> Result<Vec<TcpListener>, Error> {
        ports
            .iter()
            .map(|&port| {
                TcpListener::bind(("127.0.0.1", port)).map_err(|err| {
                    Error::Startup(format!("listen tcp 127.0.0.1:{port}: bind: {err}"))
                })
            })
            .collect()
    }

    /// Starts [`bind_all`] as every caller starts its server.
    async fn start(mut starts: Starts) -> Result<Vec<TcpListener>, Error> {
        loop {
            let ports = starts.next().await?;
            match bind_all(&ports) {
                Ok(listeners) => return Ok(listeners),
                Err(error) => starts.retry(error)?,
            }
        }
    }

    /// The ports a test took, as another test would.
    type Taken = Arc<Mutex<Vec<TcpListener>>>;

    /// A hook that takes (binds and keeps) the first of the first `n` starts' ports.
    fn take_first(n: usize) -> (Taken, impl FnMut(&[u16]) + Send) {
        let taken: Taken = Arc::default();
        let hold = Arc::clone(&taken);
        let hook = move |ports: &[u16]| {
            let mut hold = hold.lock().expect("lock");
            if hold.len() < n {
                hold.push(TcpListener::bind(("127.0.0.1", ports[0])).expect("take the port"));
            }
        };
        (taken, hook)
    }

    #[test]
    fn a_taken_port_reads_in_go_and_in_python() {
        assert!(says_address_in_use(
            "listen tcp 127.0.0.1:2379: bind: address already in use"
        ));
        assert!(says_address_in_use(
            "OSError: [Errno 98] Address already in use"
        ));
        assert!(!says_address_in_use("connection refused"));
    }

    #[tokio::test]
    async fn a_port_taken_between_pick_and_start_is_retried_on_fresh_ports() {
        let (taken, hook) = take_first(1);
        let listeners = start(Starts::fresh("test server", 2).after_pick(hook))
            .await
            .expect("started on other ports");
        let first = taken.lock().expect("lock")[0]
            .local_addr()
            .expect("addr")
            .port();
        let bound = listeners[0].local_addr().expect("addr").port();
        assert_ne!(bound, first, "the server runs on a fresh port");
    }

    #[tokio::test]
    async fn a_port_lost_at_every_attempt_names_the_server_and_the_ports() {
        let (taken, hook) = take_first(usize::MAX);
        let error = start(Starts::fresh("test server", 1).after_pick(hook))
            .await
            .expect_err("never starts");
        let message = error.to_string();
        assert!(message.contains("test server"), "{message}");
        let taken = taken.lock().expect("lock");
        assert_eq!(taken.len(), ATTEMPTS);
        for listener in taken.iter() {
            let port = listener.local_addr().expect("addr").port().to_string();
            assert!(message.contains(&port), "{message} names {port}");
        }
    }

    #[tokio::test]
    async fn any_other_failure_is_not_retried() {
        let mut starts = Starts::fresh("test server", 1);
        starts.next().await.expect("ports");
        let error = starts
            .retry(Error::Startup("bad flag --nope".into()))
            .expect_err("not retried");
        assert!(error.to_string().contains("--nope"), "{error}");
    }

    #[tokio::test]
    async fn a_restart_waits_until_its_port_is_free() {
        let ip = IpAddr::V4(Ipv4Addr::LOCALHOST);
        let old = TcpListener::bind((ip, 0)).expect("the old server");
        let port = old.local_addr().expect("addr").port();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let stopper = tokio::spawn(async move {
            let _ = rx.await;
            drop(old);
        });
        let restarted = start(Starts::same("test server", ip, &[port]));
        // The old server goes once the restart has begun waiting.
        let release = async {
            tokio::task::yield_now().await;
            let _ = tx.send(());
        };
        let (restarted, ()) = tokio::join!(restarted, release);
        let listeners = restarted.expect("restarted on the same port");
        stopper.await.expect("stopper");
        assert_eq!(listeners[0].local_addr().expect("addr").port(), port);
    }
}
