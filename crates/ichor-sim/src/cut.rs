//! A node's connections while it is cut off from its clients
//! ([`crate::Fault::PartitionFromClients`]): what a network partition does to TCP. Nothing
//! arrives and nothing is refused, both ways, on connections already open and on new ones
//! (their handshake never completes); once the partition heals, the bytes flow again. The
//! simulated nodes reach each other in-process, not over these connections, so their etcd and
//! their forwarding carry on.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// Waits until the cut heals.
type Wait = Pin<Box<dyn Future<Output = ()> + Send>>;

/// A connection that stalls while `cut` is true.
pub(crate) struct Cut<T> {
    inner: T,
    cut: watch::Receiver<bool>,
    /// Separate waits for reading and writing: each keeps the waker of its own side.
    read_wait: Option<Wait>,
    write_wait: Option<Wait>,
}

impl<T> Cut<T> {
    pub(crate) fn new(inner: T, cut: watch::Receiver<bool>) -> Self {
        Self {
            inner,
            cut,
            read_wait: None,
            write_wait: None,
        }
    }
}

/// Whether a side must wait now: the node is cut off, and the wait for the heal (kept in
/// `slot`, which registers the task's waker) has not ended.
fn stalled(cut: &watch::Receiver<bool>, slot: &mut Option<Wait>, cx: &mut Context<'_>) -> bool {
    if !*cut.borrow() {
        *slot = None;
        return false;
    }
    let wait = slot.get_or_insert_with(|| {
        let mut cut = cut.clone();
        Box::pin(async move {
            let _ = cut.wait_for(|cut| !*cut).await;
        })
    });
    if wait.as_mut().poll(cx).is_ready() {
        *slot = None;
        false
    } else {
        true
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for Cut<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if stalled(&this.cut, &mut this.read_wait, cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for Cut<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        if stalled(&this.cut, &mut this.write_wait, cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if stalled(&this.cut, &mut this.write_wait, cx) {
            return Poll::Pending;
        }
        Pin::new(&mut this.inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

impl Connected for Cut<TcpStream> {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.inner.connect_info()
    }
}
