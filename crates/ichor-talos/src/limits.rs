//! How long each Talos API call may take: one [`Limit`] per method, from the [`Limits`] a
//! [`TalosClient`](crate::TalosClient) carries, enforced on the transport so that every typed
//! operation is covered.
//!
//! A limit is either overall (from the call to the reply's last byte) or idle (the longest
//! silence: until the reply starts, and between two pieces of its body). Quick reads get a
//! short overall limit; the work Talos does for minutes gets a long one; a snapshot, which
//! streams for as long as the database is big, gets only an idle limit, so it is never cut off
//! while bytes keep arriving. A call past its limit fails with
//! [`TalosError::Timeout`](crate::TalosError::Timeout), naming the method and the limit.

use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::time::{Instant, Sleep};
use tonic::body::Body;
use tonic::codegen::Bytes;

/// The limits of one call; `None` is no limit of that kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limit {
    /// From the call to the reply's last byte.
    pub overall: Option<Duration>,
    /// The longest silence: from the call to the reply's start, and between two pieces of it.
    pub idle: Option<Duration>,
}

/// Which kind of limit a call passed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LimitKind {
    /// The call did not finish within its overall limit.
    Overall,
    /// The node sent nothing for longer than the call's idle limit.
    Idle,
}

impl LimitKind {
    fn name(self) -> &'static str {
        match self {
            Self::Overall => "overall",
            Self::Idle => "idle",
        }
    }
}

/// The limits of every call a [`TalosClient`](crate::TalosClient) makes, by method; the
/// defaults are below, and whoever builds the client may pass others
/// ([`TalosClient::with_limits`](crate::TalosClient::with_limits)).
///
/// | Method | Limit |
/// |---|---|
/// | `EtcdDefragment`, `EtcdRecover` | [`long`](Self::long) overall |
/// | `EtcdSnapshot` | [`snapshot_idle`](Self::snapshot_idle), no overall limit |
/// | `ImageService.Pull` | [`pull`](Self::pull) overall |
/// | `LifecycleService.Upgrade` | [`upgrade`](Self::upgrade) overall |
/// | every other method | [`quick`](Self::quick) overall |
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Reads and calls that hand work off, 10 s: version, hostname, services, COSI `Get` and
    /// `List`, etcd member list, status and member changes, apply, bootstrap (one attempt),
    /// reboot, reset, a fast wipe. Talos answers them from memory, or starts the work in the
    /// background and answers at once. It bounds a hung etcd member too: Talos's `EtcdStatus`
    /// waits on the local member until the caller's deadline (`v1alpha1_server.go`
    /// `Server.EtcdStatus`, through `etcd.NewLocalClient`). 10 s was the one limit of every
    /// call before there were others.
    pub quick: Duration,
    /// Heavy etcd work, 5 min: `EtcdDefragment`, which rewrites the whole database into a new
    /// file with the member blocked meanwhile (Talos hands the call's context to etcd's
    /// `Defragment`, `v1alpha1_server.go` `Server.EtcdDefragment`), and `EtcdRecover`'s upload
    /// of a snapshot. etcd's default quota is 2 GiB and 8 GiB its suggested maximum; 8 GiB at
    /// a slow disk's 30 MB/s is about 4.5 min.
    pub long: Duration,
    /// The longest silence in an `EtcdSnapshot` stream, 30 s; it has no overall limit. Talos
    /// sends the database in 1 KiB messages as etcd writes it (`v1alpha1_server.go`
    /// `Server.EtcdSnapshot`, `pkg/chunker/stream/stream.go`, default size 1024), so a healthy
    /// stream is never quiet for long, and a big one takes as long as its bytes keep coming.
    pub snapshot_idle: Duration,
    /// `ImageService.Pull`, overall, 20 min: Talos's own limit on the pulls it makes itself
    /// (`PullTimeout`, `internal/pkg/containers/image/image.go`). No idle limit: Talos reports
    /// every active layer every 100 ms whether or not its offset moves
    /// (`internal/pkg/containers/image/progress/pull_progress.go`), and nothing while it
    /// resolves the reference, so a silence tells nothing either way.
    pub pull: Duration,
    /// `LifecycleService.Upgrade`, overall, 30 min: talosctl's default wait for an upgrade
    /// (`cmd/talosctl/cmd/talos/track.go`, `--timeout`). No idle limit: the stream carries the
    /// installer's output lines, and the installer may be quiet while it writes the disk. A
    /// caller that gives up does not stop the installer: Talos waits for it on a detached
    /// context (`internal/app/lifecycle/container.go`, `task.Wait(detachedCtx)`).
    pub upgrade: Duration,
}

impl Default for Limits {
    fn default() -> Self {
        Self {
            quick: Duration::from_secs(10),
            long: Duration::from_secs(5 * 60),
            snapshot_idle: Duration::from_secs(30),
            pull: Duration::from_secs(20 * 60),
            upgrade: Duration::from_secs(30 * 60),
        }
    }
}

impl Limits {
    /// The limit of one gRPC method (`service` as `machine.MachineService`, `method` as
    /// `EtcdDefragment`); a method not named in the table is quick.
    pub fn of(&self, service: &str, method: &str) -> Limit {
        let overall = |limit| Limit {
            overall: Some(limit),
            idle: None,
        };
        match (service, method) {
            ("machine.MachineService", "EtcdDefragment" | "EtcdRecover") => overall(self.long),
            ("machine.MachineService", "EtcdSnapshot") => Limit {
                overall: None,
                idle: Some(self.snapshot_idle),
            },
            ("machine.ImageService", "Pull") => overall(self.pull),
            ("machine.LifecycleService", "Upgrade") => overall(self.upgrade),
            _ => overall(self.quick),
        }
    }
}

/// The metadata keys on a status the client makes up when a limit passes: the limit in
/// milliseconds, and its kind.
const LIMIT_MS: &str = "x-ichor-limit-ms";
const LIMIT_KIND: &str = "x-ichor-limit-kind";

/// The status of a call past its limit, marked so that [`passed`] recognizes it.
pub(crate) fn exceeded(method: &str, kind: LimitKind, limit: Duration) -> tonic::Status {
    tracing::warn!(method, kind = kind.name(), limit = ?limit, "a Talos API call passed its limit");
    let what = match kind {
        LimitKind::Overall => format!("no complete answer within {limit:?}, the overall limit"),
        LimitKind::Idle => format!("nothing received for {limit:?}, the idle limit"),
    };
    let mut status = tonic::Status::deadline_exceeded(format!("{method}: {what}"));
    let metadata = status.metadata_mut();
    let ms = u64::try_from(limit.as_millis()).unwrap_or(u64::MAX);
    metadata.insert(LIMIT_MS, tonic::metadata::MetadataValue::from(ms));
    metadata.insert(
        LIMIT_KIND,
        tonic::metadata::MetadataValue::from_static(kind.name()),
    );
    status
}

/// The kind and the limit, if `status` is one [`exceeded`] made.
pub(crate) fn passed(status: &tonic::Status) -> Option<(LimitKind, Duration)> {
    if status.code() != tonic::Code::DeadlineExceeded {
        return None;
    }
    let metadata = status.metadata();
    let kind = match metadata.get(LIMIT_KIND)?.to_str().ok()? {
        "overall" => LimitKind::Overall,
        "idle" => LimitKind::Idle,
        _ => return None,
    };
    let ms = metadata.get(LIMIT_MS)?.to_str().ok()?.parse().ok()?;
    Some((kind, Duration::from_millis(ms)))
}

/// How long the reply may take to start: the shorter of the two limits, and which one it is.
pub(crate) fn first(limit: Limit) -> Option<(LimitKind, Duration)> {
    match (limit.overall, limit.idle) {
        (Some(overall), Some(idle)) if idle < overall => Some((LimitKind::Idle, idle)),
        (Some(overall), _) => Some((LimitKind::Overall, overall)),
        (None, Some(idle)) => Some((LimitKind::Idle, idle)),
        (None, None) => None,
    }
}

/// A reply's body under its call's limits: the overall deadline (counted from the call) and
/// the idle limit between two pieces; past either, one error, then the end.
pub(crate) struct Limited {
    inner: Body,
    method: String,
    overall: Option<(Duration, Pin<Box<Sleep>>)>,
    idle: Option<(Duration, Pin<Box<Sleep>>)>,
    done: bool,
}

impl Limited {
    /// `inner` under `limit`, for a call that started at `started`.
    pub(crate) fn new(inner: Body, method: String, limit: Limit, started: Instant) -> Self {
        Self {
            inner,
            method,
            overall: limit
                .overall
                .map(|d| (d, Box::pin(tokio::time::sleep_until(started + d)))),
            idle: limit.idle.map(|d| (d, Box::pin(tokio::time::sleep(d)))),
            done: false,
        }
    }
}

impl http_body::Body for Limited {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<http_body::Frame<Bytes>, tonic::Status>>> {
        let this = self.get_mut();
        if this.done {
            return Poll::Ready(None);
        }
        if let Poll::Ready(frame) = Pin::new(&mut this.inner).poll_frame(cx) {
            if let Some((idle, sleep)) = &mut this.idle {
                sleep.as_mut().reset(Instant::now() + *idle);
            }
            this.done = frame.is_none();
            return Poll::Ready(frame);
        }
        for (kind, timer) in [
            (LimitKind::Overall, &mut this.overall),
            (LimitKind::Idle, &mut this.idle),
        ] {
            if let Some((limit, sleep)) = timer
                && sleep.as_mut().poll(cx).is_ready()
            {
                this.done = true;
                return Poll::Ready(Some(Err(exceeded(&this.method, kind, *limit))));
            }
        }
        Poll::Pending
    }

    fn is_end_stream(&self) -> bool {
        self.done || self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_work_gets_long_limits_and_a_snapshot_only_an_idle_one() {
        let limits = Limits::default();
        let quick = limits.of("machine.MachineService", "Version");
        assert_eq!(quick.overall, Some(Duration::from_secs(10)));
        assert_eq!(quick.idle, None);
        assert_eq!(
            limits.of("cosi.resource.State", "Get").overall,
            Some(limits.quick)
        );
        assert_eq!(
            limits
                .of("machine.MachineService", "EtcdDefragment")
                .overall,
            Some(limits.long)
        );
        let snapshot = limits.of("machine.MachineService", "EtcdSnapshot");
        assert_eq!(snapshot.overall, None);
        assert_eq!(snapshot.idle, Some(Duration::from_secs(30)));
        assert_eq!(
            limits.of("machine.ImageService", "Pull").overall,
            Some(limits.pull)
        );
        assert_eq!(
            limits.of("machine.LifecycleService", "Upgrade").overall,
            Some(limits.upgrade)
        );
    }

    #[test]
    fn a_made_up_status_carries_its_limit_and_a_nodes_does_not() {
        let status = exceeded("EtcdSnapshot", LimitKind::Idle, Duration::from_millis(1500));
        assert_eq!(
            passed(&status),
            Some((LimitKind::Idle, Duration::from_millis(1500)))
        );
        assert!(status.message().contains("EtcdSnapshot"), "{status:?}");
        assert_eq!(
            passed(&tonic::Status::deadline_exceeded("the node's own")),
            None
        );
    }
}
