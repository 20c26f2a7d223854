//! What a long call reports while it runs: only what the Talos API streams back, nothing
//! estimated. `EtcdSnapshot` streams bytes (no total), `ImageService.Pull` streams each layer's
//! state, `LifecycleService.Upgrade` streams the installer's output lines; `EtcdDefragment`
//! answers once, with nothing until it is done. Each long call runs in a `tracing` span
//! (`talos_call`, with the method and the endpoint) with events when it starts, ends, and at
//! most once a second while it reports progress; a caller that wants every report passes a
//! callback to the `*_with_progress` operations.

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;
use tracing::Instrument as _;

use crate::api::machine::ImageServicePullProgress;
use crate::api::machine::image_service_pull_layer_progress::Status as PullStatus;
use crate::client::{TalosClient, TalosError};

/// One report of a long call's progress, as the node's stream gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Progress {
    /// `EtcdSnapshot`: the bytes received so far (Talos sends no total).
    Received(u64),
    /// `ImageService.Pull`: one layer's state.
    Layer(LayerProgress),
    /// `LifecycleService.Upgrade`: one line of the installer's output.
    Message(String),
}

/// One layer of an image pull (`ImageServicePullProgress`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LayerProgress {
    /// The layer's id (a shortened digest).
    pub layer: String,
    /// What is happening to it.
    pub status: LayerStatus,
    /// While downloading: the bytes downloaded so far.
    pub offset: i64,
    /// While downloading: the layer's size in bytes.
    pub total: i64,
    /// While extracting: how long it has been extracting.
    pub elapsed: Duration,
}

/// The state of one layer of an image pull (`ImageServicePullLayerProgress.Status`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LayerStatus {
    /// Downloading.
    Downloading,
    /// Downloaded.
    DownloadComplete,
    /// Being extracted.
    Extracting,
    /// Extracted.
    ExtractComplete,
    /// Already in the store.
    AlreadyExists,
}

impl LayerProgress {
    /// The report of one `ImageServicePullProgress`.
    pub(crate) fn from_proto(progress: ImageServicePullProgress) -> Self {
        let layer = progress.progress.unwrap_or_default();
        let status = match PullStatus::try_from(layer.status) {
            Ok(PullStatus::DownloadComplete) => LayerStatus::DownloadComplete,
            Ok(PullStatus::Extracting) => LayerStatus::Extracting,
            Ok(PullStatus::ExtractComplete) => LayerStatus::ExtractComplete,
            Ok(PullStatus::AlreadyExists) => LayerStatus::AlreadyExists,
            Ok(PullStatus::Downloading) | Err(_) => LayerStatus::Downloading,
        };
        let elapsed = layer
            .elapsed
            .and_then(|d| Duration::try_from(d).ok())
            .unwrap_or_default();
        Self {
            layer: progress.layer_id,
            status,
            offset: layer.offset,
            total: layer.total,
            elapsed,
        }
    }
}

/// How often at most a long call's progress becomes a `tracing` event.
const EVENT_EVERY: Duration = Duration::from_secs(1);

/// Passes a long call's reports to its caller's callback, and some to `tracing`.
pub(crate) struct Reporter<'a> {
    callback: &'a mut (dyn FnMut(&Progress) + Send),
    last_event: Option<Instant>,
}

impl<'a> Reporter<'a> {
    /// Reports to `callback`.
    pub(crate) fn new(callback: &'a mut (dyn FnMut(&Progress) + Send)) -> Self {
        Self {
            callback,
            last_event: None,
        }
    }

    /// One report: always to the callback; to `tracing` when it is a message, or the last
    /// event was a second ago or more.
    pub(crate) fn report(&mut self, progress: &Progress) {
        (self.callback)(progress);
        let due = self
            .last_event
            .is_none_or(|last| last.elapsed() >= EVENT_EVERY);
        if matches!(progress, Progress::Message(_)) || due {
            self.last_event = Some(Instant::now());
            tracing::debug!(?progress, "progress");
        }
    }
}

impl TalosClient {
    /// Runs a long call in a `talos_call` span, with events when it starts and ends.
    pub(crate) async fn traced<T>(
        &self,
        method: &'static str,
        call: impl Future<Output = Result<T, TalosError>>,
    ) -> Result<T, TalosError> {
        let span = tracing::info_span!("talos_call", method, endpoint = %self.describe());
        async move {
            let started = Instant::now();
            tracing::info!("started");
            let result = call.await;
            let elapsed = started.elapsed();
            match &result {
                Ok(_) => tracing::info!(?elapsed, "finished"),
                Err(error) => tracing::warn!(?elapsed, %error, "failed"),
            }
            result
        }
        .instrument(span)
        .await
    }
}
