//! How the sim target's Ichor binaries reach its apiserver: through a TCP forwarder on a
//! loopback port of its own, open only while the apiserver is ready and its authorizer has
//! read the shipped roles, as a load balancer that checks readiness lets clients through.
//!
//! A kube-apiserver serves requests as soon as it listens, before its RBAC informers have
//! listed the roles; a request in that moment is refused although the roles grant it. The
//! binaries keep running while a spec restarts the apiserver, so without this they would
//! meet that moment, and the RBAC audit would see refusals that are not Ichor's. The
//! forwarder copies bytes; TLS runs end to end between the binary and the apiserver (whose
//! certificate names 127.0.0.1, whatever the port).

use std::net::SocketAddr;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// A forwarder to one apiserver address; it stops when dropped.
#[derive(Debug)]
pub(crate) struct Front {
    addr: SocketAddr,
    open: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Front {
    /// Starts forwarding from a free loopback port to `upstream`, open.
    pub(crate) async fn start(upstream: SocketAddr) -> std::io::Result<Self> {
        let listener = TcpListener::bind(("127.0.0.1", 0)).await?;
        let addr = listener.local_addr()?;
        let (open, watching) = watch::channel(true);
        let task = tokio::spawn(async move {
            loop {
                let Ok((inbound, _)) = listener.accept().await else {
                    continue;
                };
                // Closed: the connection is dropped at once, as a balancer without a ready
                // backend does; the client retries.
                if !*watching.borrow() {
                    continue;
                }
                tokio::spawn(forward(inbound, upstream, watching.clone()));
            }
        });
        Ok(Self { addr, open, task })
    }

    /// The URL the binaries' kubeconfigs name.
    pub(crate) fn url(&self) -> String {
        format!("https://{}", self.addr)
    }

    /// Lets no connection through, and ends those open.
    pub(crate) fn close(&self) {
        self.open.send_replace(false);
    }

    /// Lets connections through again.
    pub(crate) fn open(&self) {
        self.open.send_replace(true);
    }
}

impl Drop for Front {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Copies bytes both ways between `inbound` and `upstream` until either side ends or the
/// front closes.
async fn forward(mut inbound: TcpStream, upstream: SocketAddr, mut open: watch::Receiver<bool>) {
    let Ok(mut outbound) = TcpStream::connect(upstream).await else {
        return;
    };
    let _ = inbound.set_nodelay(true);
    let _ = outbound.set_nodelay(true);
    tokio::select! {
        _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound) => {}
        _ = open.wait_for(|open| !*open) => {}
    }
}
