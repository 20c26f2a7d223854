//! `storage.StorageService` (talos-facts §1.4): the disks, and wiping block devices — which
//! maintenance mode allows `os:reader`, and configured nodes only `os:admin`.

use std::sync::Weak;

use ichor_talos::api::storage::disk::DiskType;
use ichor_talos::api::storage::storage_service_server::StorageService;
use ichor_talos::api::storage::{
    BlockDeviceWipe, BlockDeviceWipeRequest, BlockDeviceWipeResponse, Disk, Disks, DisksResponse,
};
use tokio::sync::Mutex;
use tonic::{Request, Response, Status};

use crate::Node;
use crate::authz::{Role, authorize};

/// The storage service of one node.
pub(crate) struct Storage {
    pub(crate) node: Weak<Mutex<Node>>,
    pub(crate) maintenance: bool,
}

impl Storage {
    /// BlockDeviceWipe's own check: its rule lets os:reader through, for maintenance mode only
    /// (talos-facts §10.6).
    fn admin_once_configured<T>(&self, request: &Request<T>) -> Result<(), Status> {
        if self.maintenance {
            Ok(())
        } else {
            authorize(request, Role::Admin)
        }
    }
}

#[tonic::async_trait]
impl StorageService for Storage {
    async fn disks(&self, _request: Request<()>) -> Result<Response<DisksResponse>, Status> {
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let node = strong.lock().await;
        let disks = node
            .hardware
            .disks
            .iter()
            .map(|d| Disk {
                size: d.size,
                model: d.model.clone(),
                device_name: format!("/dev/{}", d.name),
                name: d.model.clone(),
                serial: d.serial.clone(),
                r#type: if d.cdrom { DiskType::Cd } else { DiskType::Ssd } as i32,
                subsystem: "/sys/class/block".into(),
                system_disk: node.installed && !d.cdrom && node.hardware.install_disk() == Some(d),
                ..Default::default()
            })
            .collect();
        Ok(Response::new(DisksResponse {
            messages: vec![Disks {
                metadata: None,
                disks,
            }],
        }))
    }

    /// Wipes the named devices (no `/dev/` prefix, talos-facts §1.4). A device that does not
    /// exist, or that a user volume is on, is refused before anything is wiped; wiping the
    /// installed system disk makes the machine not installed, wiping a user volume's disk takes
    /// what the volumes wrote there.
    async fn block_device_wipe(
        &self,
        request: Request<BlockDeviceWipeRequest>,
    ) -> Result<Response<BlockDeviceWipeResponse>, Status> {
        self.admin_once_configured(&request)?;
        let request = request.into_inner();
        let strong = self
            .node
            .upgrade()
            .ok_or_else(|| Status::unavailable("the node is shutting down"))?;
        let mut node = strong.lock().await;
        for device in &request.devices {
            if device.device.starts_with("/dev/") {
                return Err(Status::invalid_argument(format!(
                    "device {:?}: name it without /dev/",
                    device.device
                )));
            }
            if !node.hardware.disks.iter().any(|d| d.name == device.device) {
                return Err(Status::not_found(format!(
                    "blockdevice {:?} not found",
                    device.device
                )));
            }
            // A volume on the disk (or one of its partitions) holds it (`storaged/server.go`).
            if !device.skip_volume_check
                && let Some(volume) = crate::volumes::in_use(&mut node, &device.device)
            {
                return Err(Status::failed_precondition(format!(
                    "blockdevice {:?} is in use by volume {volume:?}",
                    device.device
                )));
            }
            if !self.maintenance
                && !device.skip_volume_check
                && node
                    .hardware
                    .install_disk()
                    .is_some_and(|d| d.name == device.device)
            {
                return Err(Status::failed_precondition(format!(
                    "blockdevice {:?} is in use by the system volumes",
                    device.device
                )));
            }
        }
        for device in &request.devices {
            crate::volumes::wipe(&mut node, &device.device);
            if node
                .hardware
                .install_disk()
                .is_some_and(|d| d.name == device.device)
            {
                node.installed = false;
            }
        }
        Ok(Response::new(BlockDeviceWipeResponse {
            messages: vec![BlockDeviceWipe { metadata: None }],
        }))
    }
}
