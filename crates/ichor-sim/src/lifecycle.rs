//! `machine.LifecycleService` and `machine.ImageService` (talos-facts §1.3, §8.2): pulling an
//! installer image into the system containerd, then upgrading from it.

use std::pin::Pin;
use std::sync::Weak;

use ichor_talos::api::machine::image_service_pull_response::Response as PullReply;
use ichor_talos::api::machine::image_service_server::ImageService;
use ichor_talos::api::machine::lifecycle_service_install_progress::Response as Progress;
use ichor_talos::api::machine::lifecycle_service_server::LifecycleService;
use ichor_talos::api::machine::{
    ImageServicePullRequest, ImageServicePullResponse, LifecycleServiceInstallProgress,
    LifecycleServiceInstallRequest, LifecycleServiceInstallResponse,
    LifecycleServiceUpgradeRequest, LifecycleServiceUpgradeResponse,
};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::Node;
use crate::configured::{Role, authorize, image_version, upgrade_later};

type Stream<T> = Pin<Box<dyn tokio_stream::Stream<Item = Result<T, Status>> + Send>>;

/// Maintenance mode grants `os:reader` only, and these need `os:admin` (talos-facts §2).
fn admin_only<T>(request: &Request<T>, maintenance: bool) -> Result<(), Status> {
    if maintenance {
        return Err(Status::permission_denied(
            "not authorized: this method needs os:admin, and maintenance mode grants every caller os:reader",
        ));
    }
    authorize(request, Role::Admin)
}

/// The lifecycle service of one node.
pub(crate) struct Lifecycle {
    pub(crate) node: Weak<Mutex<Node>>,
    pub(crate) maintenance: bool,
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
        request: Request<LifecycleServiceInstallRequest>,
    ) -> Result<Response<Self::InstallStream>, Status> {
        admin_only(&request, self.maintenance)?;
        Err(crate::not_simulated("LifecycleService.Install"))
    }

    type UpgradeStream = Stream<LifecycleServiceUpgradeResponse>;

    /// Upgrades from an image pulled beforehand (talos-facts §1.3). Failures end the stream
    /// with a non-zero exit code, not a gRPC error; on success the node reboots into the
    /// image's version.
    async fn upgrade(
        &self,
        request: Request<LifecycleServiceUpgradeRequest>,
    ) -> Result<Response<Self::UpgradeStream>, Status> {
        admin_only(&request, self.maintenance)?;
        let image = request
            .into_inner()
            .source
            .map(|s| s.image_name)
            .unwrap_or_default();
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let node = strong.lock().await;
        let mut replies = vec![progress(Progress::Message(format!(
            "upgrading from {image}"
        )))];
        if !node.installed {
            replies.push(progress(Progress::Message("Talos is not installed".into())));
            replies.push(progress(Progress::ExitCode(1)));
        } else if !node.images.contains(&image) {
            replies.push(progress(Progress::Message(format!(
                "image {image:?} not found: pull it first"
            ))));
            replies.push(progress(Progress::ExitCode(1)));
        } else if image_version(&image).is_none() {
            replies.push(progress(Progress::Message(format!(
                "image {image:?} carries no Talos version tag"
            ))));
            replies.push(progress(Progress::ExitCode(1)));
        } else {
            replies.push(progress(Progress::Message("installation complete".into())));
            replies.push(progress(Progress::ExitCode(0)));
            drop(node);
            upgrade_later(self.node.clone(), &image);
        }
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}

/// The image service of one node.
pub(crate) struct Images {
    pub(crate) node: Weak<Mutex<Node>>,
    pub(crate) maintenance: bool,
}

#[tonic::async_trait]
impl ImageService for Images {
    type PullStream = Stream<ImageServicePullResponse>;

    /// Pulls an image into the system containerd: progress, then the resolved name.
    async fn pull(
        &self,
        request: Request<ImageServicePullRequest>,
    ) -> Result<Response<Self::PullStream>, Status> {
        admin_only(&request, self.maintenance)?;
        let image = request.into_inner().image_ref;
        if image.is_empty() {
            return Err(Status::invalid_argument("image_ref is required"));
        }
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        strong.lock().await.images.insert(image.clone());
        let replies = vec![Ok(ImageServicePullResponse {
            response: Some(PullReply::Name(image)),
        })];
        Ok(Response::new(Box::pin(tokio_stream::iter(replies))))
    }
}
