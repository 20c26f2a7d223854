//! An etcd snapshot streamed out of a node chunk by chunk, never held whole, and checked as it
//! passes the way `talosctl etcd snapshot` checks the file it saves (talos-facts §12.1; ADR
//! 0013): the size leaves 32 bytes over a multiple of 512, and those 32 bytes are the SHA-256
//! of everything before them.

use std::pin::Pin;
use std::task::{Context as TaskContext, Poll};

use ring::digest::{Context, SHA256};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;

use crate::api::common::Data;
use crate::api::machine::EtcdSnapshotRequest;
use crate::client::{TalosClient, TalosError};
use crate::progress::{Progress, Reporter};

/// The length of etcd's SHA-256 trailer.
const TRAILER: usize = 32;
/// A snapshot's size, less its trailer, is a whole number of these (bbolt's smallest page).
const PAGE: u64 = 512;

/// What a checked snapshot was.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SnapshotSummary {
    /// Its size in bytes, trailer included.
    pub size: u64,
    /// The SHA-256 of the database (the trailer's value), as lowercase hex.
    pub sha256: String,
}

/// Why streamed bytes are not a whole etcd snapshot.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SnapshotProblem {
    /// The size does not leave 32 bytes over a multiple of 512: cut short, or no trailer.
    #[error(
        "{size} bytes is not an etcd snapshot's size (a multiple of 512 plus a 32-byte SHA-256 trailer): cut short?"
    )]
    Size {
        /// The size received.
        size: u64,
    },
    /// The trailer is not the SHA-256 of the bytes before it.
    #[error("the snapshot's SHA-256 trailer {found} does not match its contents ({computed})")]
    Trailer {
        /// The trailer received, hex.
        found: String,
        /// The SHA-256 computed, hex.
        computed: String,
    },
}

/// Checks a snapshot's size and trailer incrementally: feed it every chunk in order, then
/// [`finish`](Self::finish). Holds at most the last 32 bytes.
pub struct SnapshotCheck {
    hasher: Context,
    tail: Vec<u8>,
    size: u64,
}

impl Default for SnapshotCheck {
    fn default() -> Self {
        Self {
            hasher: Context::new(&SHA256),
            tail: Vec::with_capacity(2 * TRAILER),
            size: 0,
        }
    }
}

impl std::fmt::Debug for SnapshotCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotCheck")
            .field("size", &self.size)
            .finish_non_exhaustive()
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

impl SnapshotCheck {
    /// The next chunk: everything but the last 32 bytes seen so far is hashed.
    pub fn update(&mut self, chunk: &[u8]) {
        self.size += chunk.len() as u64;
        if chunk.len() >= TRAILER {
            self.hasher.update(&self.tail);
            let (body, tail) = chunk.split_at(chunk.len() - TRAILER);
            self.hasher.update(body);
            self.tail.clear();
            self.tail.extend_from_slice(tail);
        } else {
            self.tail.extend_from_slice(chunk);
            let over = self.tail.len().saturating_sub(TRAILER);
            self.hasher.update(&self.tail[..over]);
            self.tail.drain(..over);
        }
    }

    /// The bytes fed so far.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// Whether what was fed is a whole snapshot: its size and its trailer.
    pub fn finish(self) -> Result<SnapshotSummary, SnapshotProblem> {
        let size = self.size;
        if size < TRAILER as u64 + PAGE || !(size - TRAILER as u64).is_multiple_of(PAGE) {
            return Err(SnapshotProblem::Size { size });
        }
        let computed = hex(self.hasher.finish().as_ref());
        let found = hex(&self.tail);
        if computed != found {
            return Err(SnapshotProblem::Trailer { found, computed });
        }
        Ok(SnapshotSummary {
            size,
            sha256: computed,
        })
    }
}

impl TalosClient {
    /// Streams the node's etcd snapshot into `chunks` as it arrives (a bounded channel holds
    /// the backpressure: nothing is held whole), checks its size and SHA-256 trailer, and
    /// returns what it was; `progress` hears the bytes received. The channel closes when the
    /// stream ends. A receiver dropped early stops the stream with an error, and so does a
    /// snapshot that is cut short or whose trailer does not match (the receiver has seen it
    /// all by then: whoever stores it must not keep it).
    pub async fn etcd_snapshot_to(
        &self,
        chunks: mpsc::Sender<Vec<u8>>,
        mut progress: impl FnMut(&Progress) + Send,
    ) -> Result<SnapshotSummary, TalosError> {
        const METHOD: &str = SNAPSHOT;
        let mut reporter = Reporter::new(&mut progress);
        self.traced(METHOD, async {
            let mut stream = self.snapshot_chunks().await?;
            let mut check = SnapshotCheck::default();
            while let Some(bytes) = stream.next().await? {
                check.update(&bytes);
                reporter.report(&Progress::Received(check.size()));
                if chunks.send(bytes).await.is_err() {
                    return Err(self.node_error(
                        METHOD,
                        "the snapshot's receiver stopped reading: the stream was abandoned".into(),
                    ));
                }
            }
            let summary = check
                .finish()
                .map_err(|problem| self.node_error(METHOD, problem.to_string()))?;
            tracing::info!(bytes = summary.size, sha256 = %summary.sha256, "snapshot streamed");
            Ok(summary)
        })
        .await
    }
}

/// The method that streams a snapshot out.
const SNAPSHOT: &str = "EtcdSnapshot";

/// The method that uploads a snapshot for a recovering Bootstrap.
const RECOVER: &str = "EtcdRecover";

/// How many bytes each uploaded `common.Data` message carries: talosctl reads the file 4 KiB
/// at a time and sends each read as one message (siderolabs/talos
/// `pkg/machinery/client/client.go` `Client.EtcdRecover`, v1.14.0-rc.1).
pub(crate) const UPLOAD_CHUNK: usize = 4096;

/// An open `EtcdSnapshot` stream: the one place its messages are read and their errors
/// surfaced, for every way of taking a snapshot.
pub(crate) struct SnapshotChunks<'a> {
    client: &'a TalosClient,
    stream: tonic::Streaming<Data>,
}

impl SnapshotChunks<'_> {
    /// The next chunk's bytes; `None` once the stream ended. A failed stream, or a message
    /// whose metadata carries the node's error, is an error.
    pub(crate) async fn next(&mut self) -> Result<Option<Vec<u8>>, TalosError> {
        let Some(chunk) = self.stream.next().await else {
            return Ok(None);
        };
        let chunk = chunk.map_err(self.client.rpc_error(SNAPSHOT))?;
        if let Some(error) = chunk
            .metadata
            .as_ref()
            .map(|m| m.error.clone())
            .filter(|e| !e.is_empty())
        {
            return Err(self.client.node_error(SNAPSHOT, error));
        }
        Ok(Some(chunk.bytes))
    }
}

/// What an upload sends: the bytes from a channel, cut into [`UPLOAD_CHUNK`] messages (the
/// last one shorter), holding at most one message and one received chunk.
struct Rechunk {
    chunks: mpsc::Receiver<Vec<u8>>,
    pending: Vec<u8>,
    /// How much of `pending` was sent already.
    sent: usize,
    /// The channel closed: what is pending is the end.
    closed: bool,
}

impl Rechunk {
    fn message(&mut self, len: usize) -> Data {
        let bytes = self.pending[self.sent..self.sent + len].to_vec();
        self.sent += len;
        Data {
            metadata: None,
            bytes,
        }
    }
}

impl tokio_stream::Stream for Rechunk {
    type Item = Data;

    fn poll_next(mut self: Pin<&mut Self>, cx: &mut TaskContext<'_>) -> Poll<Option<Data>> {
        loop {
            let available = self.pending.len() - self.sent;
            if available >= UPLOAD_CHUNK {
                return Poll::Ready(Some(self.message(UPLOAD_CHUNK)));
            }
            if self.closed {
                return Poll::Ready((available > 0).then(|| self.message(available)));
            }
            match self.chunks.poll_recv(cx) {
                Poll::Ready(Some(bytes)) => {
                    let sent = self.sent;
                    self.pending.drain(..sent);
                    self.sent = 0;
                    self.pending.extend_from_slice(&bytes);
                }
                Poll::Ready(None) => self.closed = true,
                Poll::Pending => return Poll::Pending,
            }
        }
    }
}

impl TalosClient {
    /// Opens the node's `EtcdSnapshot` stream.
    pub(crate) async fn snapshot_chunks(&self) -> Result<SnapshotChunks<'_>, TalosError> {
        let stream = self
            .machine()
            .etcd_snapshot(self.request(EtcdSnapshotRequest {}))
            .await
            .map_err(self.rpc_error(SNAPSHOT))?
            .into_inner();
        Ok(SnapshotChunks {
            client: self,
            stream,
        })
    }

    /// Uploads an etcd snapshot for a later recovering Bootstrap
    /// ([`bootstrap_recover`](Self::bootstrap_recover)), streaming it from `chunks` as they
    /// come: nothing is held whole, and the bytes are sent in 4 KiB `common.Data` messages as
    /// talosctl sends them. The upload ends when every sender of `chunks` is gone, so a
    /// producer that failed part-way has uploaded a cut-short file: it must not go on to
    /// bootstrap from it.
    ///
    /// Talos writes whatever arrives to `/var/lib/etcd.snapshot` (replacing an earlier upload)
    /// and checks nothing until the recovery (siderolabs/talos
    /// `internal/app/machined/internal/server/v1alpha1/v1alpha1_server.go`
    /// `Server.EtcdRecover`, v1.14.0-rc.1). Admin only, control planes only; held to
    /// [`Limits::long`](crate::Limits::long).
    pub async fn etcd_recover_from(
        &self,
        chunks: mpsc::Receiver<Vec<u8>>,
    ) -> Result<(), TalosError> {
        const METHOD: &str = RECOVER;
        self.traced(METHOD, async {
            let upload = Rechunk {
                chunks,
                pending: Vec::with_capacity(2 * UPLOAD_CHUNK),
                sent: 0,
                closed: false,
            };
            let reply = self
                .machine()
                .etcd_recover(self.request(upload))
                .await
                .map_err(self.rpc_error(METHOD))?
                .into_inner();
            self.single(METHOD, reply.messages, |m| m.metadata.as_ref())
                .map(drop)
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A snapshot-shaped byte string: `pages` pages of a pattern, then its SHA-256.
    fn snapshot(pages: usize) -> Vec<u8> {
        let body: Vec<u8> = (0..pages * 512).map(|i| (i % 251) as u8).collect();
        let digest = ring::digest::digest(&SHA256, &body);
        let mut out = body;
        out.extend_from_slice(digest.as_ref());
        out
    }

    fn check_in(bytes: &[u8], chunk: usize) -> Result<SnapshotSummary, SnapshotProblem> {
        let mut check = SnapshotCheck::default();
        for part in bytes.chunks(chunk) {
            check.update(part);
        }
        check.finish()
    }

    #[test]
    fn any_chunking_gives_the_same_summary() {
        let bytes = snapshot(5);
        let whole = check_in(&bytes, bytes.len()).expect("a snapshot");
        assert_eq!(whole.size, 5 * 512 + 32);
        for chunk in [1, 7, 31, 32, 33, 512, 1024] {
            assert_eq!(check_in(&bytes, chunk).as_ref(), Ok(&whole), "{chunk}");
        }
    }

    #[tokio::test]
    async fn an_upload_is_cut_into_4_kib_messages_whatever_the_chunks_it_comes_in() {
        let bytes: Vec<u8> = (0..3 * UPLOAD_CHUNK + 100)
            .map(|i| (i % 253) as u8)
            .collect();
        for size in [1, 100, 4095, 4096, 4097, 10_000, bytes.len()] {
            let (tx, rx) = mpsc::channel(2);
            let parts: Vec<Vec<u8>> = bytes.chunks(size).map(<[u8]>::to_vec).collect();
            let feed = tokio::spawn(async move {
                tx.send(Vec::new()).await.expect("send");
                for part in parts {
                    tx.send(part).await.expect("send");
                }
            });
            let messages: Vec<Data> = Rechunk {
                chunks: rx,
                pending: Vec::new(),
                sent: 0,
                closed: false,
            }
            .collect()
            .await;
            feed.await.expect("feed");
            let lens: Vec<usize> = messages.iter().map(|m| m.bytes.len()).collect();
            assert_eq!(lens, [4096, 4096, 4096, 100], "chunks of {size}");
            let joined: Vec<u8> = messages.into_iter().flat_map(|m| m.bytes).collect();
            assert_eq!(joined, bytes, "chunks of {size}");
        }
    }

    #[test]
    fn a_short_or_altered_snapshot_is_refused() {
        let bytes = snapshot(4);
        assert_eq!(
            check_in(&bytes[..bytes.len() - 1], 100),
            Err(SnapshotProblem::Size { size: 4 * 512 + 31 })
        );
        assert!(matches!(
            check_in(&bytes[..512], 64),
            Err(SnapshotProblem::Size { .. })
        ));
        let mut altered = bytes.clone();
        altered[700] ^= 1;
        assert!(matches!(
            check_in(&altered, 1024),
            Err(SnapshotProblem::Trailer { .. })
        ));
    }
}
