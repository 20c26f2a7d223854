//! An etcd snapshot streamed out of a node chunk by chunk, never held whole, and checked as it
//! passes the way `talosctl etcd snapshot` checks the file it saves (talos-facts §12.1; ADR
//! 0013): the size leaves 32 bytes over a multiple of 512, and those 32 bytes are the SHA-256
//! of everything before them.

use ring::digest::{Context, SHA256};
use tokio::sync::mpsc;
use tokio_stream::StreamExt as _;

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
        const METHOD: &str = "EtcdSnapshot";
        let mut reporter = Reporter::new(&mut progress);
        self.traced(METHOD, async {
            let mut stream = self
                .machine()
                .etcd_snapshot(self.request(EtcdSnapshotRequest {}))
                .await
                .map_err(self.rpc_error(METHOD))?
                .into_inner();
            let mut check = SnapshotCheck::default();
            while let Some(chunk) = stream.next().await {
                let chunk = chunk.map_err(self.rpc_error(METHOD))?;
                if let Some(error) = chunk
                    .metadata
                    .as_ref()
                    .map(|m| m.error.clone())
                    .filter(|e| !e.is_empty())
                {
                    return Err(self.node_error(METHOD, error));
                }
                check.update(&chunk.bytes);
                reporter.report(&Progress::Received(check.size()));
                if chunks.send(chunk.bytes).await.is_err() {
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
