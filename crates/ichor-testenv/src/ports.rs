//! Loopback ports for the servers the tests start, and the one way every such server is
//! started: [`FreshPorts`] for a first start, [`SamePorts`] for a restart (or a server whose
//! port is fixed).
//!
//! A port that was free when it was picked may be taken by another test before the server
//! binds it. The server then says so by exiting (etcd, kube-apiserver, weed) or by failing to
//! become ready; either way its start fails, and a failed start counts as a *lost port* when,
//! once the server is stopped, one of its ports is held by another process (our own bind of
//! it fails with [`std::io::ErrorKind::AddrInUse`]), or — when the other process let go again
//! meanwhile — its error reports `address already in use`. The servers are Go programs that
//! report a failed bind only as text; that text is read in one place, [`says_address_in_use`].
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
/// log text stands for a failed bind (Go's `bind: address already in use`).
pub fn says_address_in_use(text: &str) -> bool {
    text.contains("address already in use")
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

/// Starts a server on ports picked fresh for each attempt.
pub struct FreshPorts {
    server: &'static str,
    ip: IpAddr,
    count: usize,
    after_pick: Option<AfterPick>,
}

impl std::fmt::Debug for FreshPorts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreshPorts")
            .field("server", &self.server)
            .field("ip", &self.ip)
            .field("count", &self.count)
            .finish_non_exhaustive()
    }
}

impl FreshPorts {
    /// `count` ports on 127.0.0.1 for the server named `server`.
    pub fn new(server: &'static str, count: usize) -> Self {
        Self {
            server,
            ip: IpAddr::V4(Ipv4Addr::LOCALHOST),
            count,
            after_pick: None,
        }
    }

    /// Picks the ports on `ip` rather than 127.0.0.1.
    pub fn on(mut self, ip: IpAddr) -> Self {
        self.ip = ip;
        self
    }

    /// Runs `hook` with each attempt's ports after they are picked and before the server
    /// starts: a test's way to take one of them, as another test would.
    pub fn after_pick(mut self, hook: impl FnMut(&[u16]) + Send + 'static) -> Self {
        self.after_pick = Some(Box::new(hook));
        self
    }

    /// Runs `attempt` with fresh ports until it succeeds, starting again on fresh ports when
    /// a port was lost ([`ATTEMPTS`] times at most). `attempt` must stop whatever it started
    /// before it returns an error.
    pub async fn start<T>(
        mut self,
        mut attempt: impl AsyncFnMut(&[u16]) -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut tried = Vec::new();
        loop {
            let ports = (0..self.count)
                .map(|_| pick(self.ip))
                .collect::<Result<Vec<_>, _>>()?;
            if let Some(hook) = self.after_pick.as_mut() {
                hook(&ports);
            }
            let error = match attempt(&ports).await {
                Ok(started) => return Ok(started),
                Err(error) => error,
            };
            let was_lost = lost(self.ip, &ports, &error);
            tried.push(ports);
            if !was_lost {
                return Err(error);
            }
            if tried.len() >= ATTEMPTS {
                return Err(given_up(self.server, self.ip, &tried, error));
            }
            tracing::info!(
                server = self.server,
                ports = ?tried.last(),
                "a port was taken before the server bound it; starting again on fresh ports"
            );
        }
    }
}

/// Starts a server on ports it must keep: a restart (its clients know the address) or a
/// fixed endpoint.
#[derive(Debug, Clone)]
pub struct SamePorts<'a> {
    server: &'static str,
    ip: IpAddr,
    ports: &'a [u16],
}

impl<'a> SamePorts<'a> {
    /// The ports `ports` of `ip` for the server named `server`.
    pub fn new(server: &'static str, ip: IpAddr, ports: &'a [u16]) -> Self {
        Self { server, ip, ports }
    }

    /// Waits until every port is free (the process that had it is gone), then runs
    /// `attempt`; when a port was lost again between that check and the start, waits and
    /// starts again ([`ATTEMPTS`] times at most). `attempt` must stop whatever it started
    /// before it returns an error.
    pub async fn start<T>(
        self,
        mut attempt: impl AsyncFnMut() -> Result<T, Error>,
    ) -> Result<T, Error> {
        let mut tried = Vec::new();
        loop {
            self.wait_free().await?;
            let error = match attempt().await {
                Ok(started) => return Ok(started),
                Err(error) => error,
            };
            tried.push(self.ports.to_vec());
            if !lost(self.ip, self.ports, &error) {
                return Err(error);
            }
            if tried.len() >= ATTEMPTS {
                return Err(given_up(self.server, self.ip, &tried, error));
            }
        }
    }

    /// Waits until no other process holds one of the ports.
    async fn wait_free(&self) -> Result<(), Error> {
        let what = format!(
            "{}'s ports {:?} on {} to be free",
            self.server, self.ports, self.ip
        );
        try_eventually(&what, FREE_TIMEOUT, || async {
            match self.ports.iter().find(|&&port| held(self.ip, port)) {
                Some(port) => Err(format!(
                    "{} is held by another process",
                    SocketAddr::from((self.ip, *port))
                )),
                None => Ok(()),
            }
        })
        .await
        .map(|_| ())
        .map_err(|timeout| Error::Timeout(timeout.to_string()))
    }
}

/// Starts a server at `address`: on a fresh port of its IP when its port is 0
/// ([`FreshPorts`]), else on that port once it is free ([`SamePorts`]). `attempt` gets the
/// port and must stop whatever it started before it returns an error.
pub async fn start_at<T>(
    server: &'static str,
    address: SocketAddr,
    mut attempt: impl AsyncFnMut(u16) -> Result<T, Error>,
) -> Result<T, Error> {
    if address.port() == 0 {
        FreshPorts::new(server, 1)
            .on(address.ip())
            .start(async |ports| attempt(ports[0]).await)
            .await
    } else {
        SamePorts::new(server, address.ip(), &[address.port()])
            .start(async || attempt(address.port()).await)
            .await
    }
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

    #[tokio::test]
    async fn a_port_taken_between_pick_and_start_is_retried_on_fresh_ports() {
        let taken: Arc<Mutex<Vec<TcpListener>>> = Arc::default();
        let first = Arc::new(Mutex::new(None));
        let (hold, seen) = (Arc::clone(&taken), Arc::clone(&first));
        let listeners = FreshPorts::new("test server", 2)
            .after_pick(move |ports| {
                let mut seen = seen.lock().expect("lock");
                if seen.is_none() {
                    *seen = Some(ports[0]);
                    let listener = TcpListener::bind(("127.0.0.1", ports[0])).expect("take it");
                    hold.lock().expect("lock").push(listener);
                }
            })
            .start(async |ports| bind_all(ports))
            .await
            .expect("started on other ports");
        let first = first.lock().expect("lock").expect("a first pick");
        let bound = listeners[0].local_addr().expect("addr").port();
        assert_ne!(bound, first, "the server runs on a fresh port");
        assert!(held(IpAddr::V4(Ipv4Addr::LOCALHOST), first));
    }

    #[tokio::test]
    async fn a_port_lost_at_every_attempt_names_the_server_and_the_ports() {
        let taken: Arc<Mutex<Vec<TcpListener>>> = Arc::default();
        let hold = Arc::clone(&taken);
        let error = FreshPorts::new("test server", 1)
            .after_pick(move |ports| {
                let listener = TcpListener::bind(("127.0.0.1", ports[0])).expect("take it");
                hold.lock().expect("lock").push(listener);
            })
            .start(async |ports| bind_all(ports))
            .await
            .expect_err("never starts");
        let message = error.to_string();
        assert!(message.contains("test server"), "{message}");
        for listener in taken.lock().expect("lock").iter() {
            let port = listener.local_addr().expect("addr").port().to_string();
            assert!(message.contains(&port), "{message} names {port}");
        }
        assert_eq!(taken.lock().expect("lock").len(), ATTEMPTS);
    }

    #[tokio::test]
    async fn any_other_failure_is_not_retried() {
        let mut attempts = 0;
        let error = FreshPorts::new("test server", 1)
            .start(async |_| {
                attempts += 1;
                Err::<(), _>(Error::Startup("bad flag --nope".into()))
            })
            .await
            .expect_err("fails");
        assert_eq!(attempts, 1);
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
        let mut attempts = 0;
        let mut tx = Some(tx);
        let ports = [port];
        let restarted = SamePorts::new("test server", ip, &ports).start(async || {
            attempts += 1;
            bind_all(&[port])
        });
        // The old server goes once the restart has begun waiting.
        let release = async {
            tokio::task::yield_now().await;
            if let Some(tx) = tx.take() {
                let _ = tx.send(());
            }
        };
        let (restarted, ()) = tokio::join!(restarted, release);
        let listeners = restarted.expect("restarted on the same port");
        stopper.await.expect("stopper");
        assert_eq!(listeners[0].local_addr().expect("addr").port(), port);
        assert_eq!(attempts, 1, "started once, after the port was free");
    }
}
