//! `machine.LifecycleService` and `machine.ImageService` (talos-facts §1.3, §8.2, §10.9):
//! pulling an installer image into the system containerd, then installing the upgrade from
//! it to disk; the node boots it at its next reboot, which the caller asks for separately, with
//! the installer's extensions (talos-facts §9.5). An installer of the Image Factory's whose
//! schematic the node's factory does not know cannot be pulled (§9.10, `factory.rs`).
//! Roles are checked before these run (`authz`): both need os:admin, so maintenance mode
//! (every caller os:reader) cannot call them.

use std::pin::Pin;
use std::sync::Weak;

use ichor_talos::api::machine::image_service_pull_layer_progress::Status as LayerStatus;
use ichor_talos::api::machine::image_service_pull_response::Response as PullReply;
use ichor_talos::api::machine::image_service_server::ImageService;
use ichor_talos::api::machine::lifecycle_service_install_progress::Response as Progress;
use ichor_talos::api::machine::lifecycle_service_server::LifecycleService;
use ichor_talos::api::machine::{
    ImageServicePullLayerProgress, ImageServicePullProgress, ImageServicePullRequest,
    ImageServicePullResponse, LifecycleServiceInstallProgress, LifecycleServiceInstallRequest,
    LifecycleServiceInstallResponse, LifecycleServiceUpgradeRequest,
    LifecycleServiceUpgradeResponse,
};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::Node;
use crate::configured::image_version;

/// The size of the one layer a simulated pull reports.
const LAYER_SIZE: i64 = 48 << 20;

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

/// The lifecycle service of one node.
pub(crate) struct Lifecycle {
    pub(crate) node: Weak<Mutex<Node>>,
}

fn progress(response: Progress) -> Result<LifecycleServiceUpgradeResponse, Status> {
    Ok(LifecycleServiceUpgradeResponse {
        progress: Some(LifecycleServiceInstallProgress {
            response: Some(response),
        }),
    })
}

#[tonic::async_trait]
impl LifecycleService for Lifecycle {
    type InstallStream = Stream<LifecycleServiceInstallResponse>;

    async fn install(
        &self,
        _request: Request<LifecycleServiceInstallRequest>,
    ) -> Result<Response<Self::InstallStream>, Status> {
        Err(crate::not_simulated("LifecycleService.Install"))
    }

    type UpgradeStream = Stream<LifecycleServiceUpgradeResponse>;

    /// Upgrades from an image pulled beforehand (talos-facts §1.3, §10.9): refused with
    /// `FailedPrecondition` when Talos is not installed, `Internal` when the image is not in
    /// the system containerd; otherwise the installer's progress and exit code 0, and the new
    /// version waits on disk for the next boot. The stream carries no reboot: talosctl and
    /// Ichor send Reboot afterwards.
    async fn upgrade(
        &self,
        request: Request<LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        let image = request
            .into_inner()
            .source
            .map(|s| s.image_name)
            .unwrap_or_default();
        if image.is_empty() {
            return Err(Status::invalid_argument("installer image name is required"));
        }
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let mut node = strong.lock().await;
        if !node.installed {
            return Err(Status::failed_precondition("machine is not installed"));
        }
        if !node.images.contains(&image) {
            return Err(Status::internal(format!(
                "upgrade failed: installer image {image:?} not found in containerd store: image {image:?}: not found"
            )));
        }
        let mut replies = vec![progress(Progress::Message(format!(
            "upgrading from {image}"
        )))];
        match image_version(&image) {
            None => {
                replies.push(progress(Progress::Message(format!(
                    "image {image:?} carries no Talos version tag the simulator can install"
                ))));
                replies.push(progress(Progress::ExitCode(1)));
            }
            Some(version) => {
                node.pending_version = Some(version);
                node.pending_installer = Some(image.clone());
                replies.push(progress(Progress::Message("installation complete".into())));
                replies.push(progress(Progress::ExitCode(0)));
            }
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}

/// The image service of one node.
pub(crate) struct Images {
    pub(crate) node: Weak<Mutex<Node>>,
}

#[tonic::async_trait]
impl ImageService for Images {
    type PullStream = Stream<ImageServicePullResponse>;

    /// Pulls an image into the system containerd: progress, then the resolved name. A new
    /// image is one layer, reported downloading (half way), downloaded and extracted, as
    /// Talos reports each layer (`internal/app/images/images.go` `Service.Pull`,
    /// `internal/pkg/containers/image/progress/pull_progress.go`); an image already there is
    /// not pulled again and has no progress (`image.WithSkipIfAlreadyPulled`).
    ///
    /// An installer of the Image Factory's whose schematic it does not know is not found
    /// (talos-facts §9.4, §9.10): `NotFound` "error pulling image: …" with containerd's
    /// error, which 1.13 wraps in go-retry's error set (`internal/app/images/images.go`
    /// `Service.Pull` with `WithMaxNotFoundRetries(0)`, v1.13.9) and 1.14 does not (a single
    /// attempt, `internal/pkg/containers/image/pull.go` `Pull`, v1.14.0-rc.1).
    async fn pull(
        &self,
        request: Request<ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        let image = request.into_inner().image_ref;
        if image.is_empty() {
            return Err(Status::invalid_argument("image_ref is required"));
        }
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let mut node = strong.lock().await;
        if let Some(error) = node.factory.pull_error(&image) {
            let error = if node.shared.is_1_14() {
                error
            } else {
                format!("1 error(s) occurred:\n\t{error}")
            };
            return Err(Status::not_found(format!("error pulling image: {error}")));
        }
        let fresh = node.images.insert(image.clone());
        drop(node);
        let mut replies = Vec::new();
        if fresh {
            let digest = ring::digest::digest(&ring::digest::SHA256, image.as_bytes());
            let layer: String = digest.as_ref()[..6]
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect();
            for (status, offset) in [
                (LayerStatus::Downloading, LAYER_SIZE / 2),
                (LayerStatus::DownloadComplete, 0),
                (LayerStatus::ExtractComplete, 0),
            ] {
                replies.push(Ok(ImageServicePullResponse {
                    response: Some(PullReply::PullProgress(ImageServicePullProgress {
                        layer_id: layer.clone(),
                        progress: Some(ImageServicePullLayerProgress {
                            status: status as i32,
                            elapsed: None,
                            offset,
                            total: if offset > 0 { LAYER_SIZE } else { 0 },
                        }),
                    })),
                }));
            }
        }
        replies.push(Ok(ImageServicePullResponse {
            response: Some(PullReply::Name(image)),
        }));
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}
