//! Typed reads of COSI resources (talos-facts §1.6, §3, §8.1, §9.5): hardware inventory, system
//! extensions and machine status. Specs are decoded from their YAML form, whose keys are
//! Talos's yaml tags.

use serde::Deserialize;
use serde_json::Value;
use tokio_stream::StreamExt as _;

use crate::api::cosi::resource::label_term::Operation;
use crate::api::cosi::resource::state_client::StateClient;
use crate::api::cosi::resource::{GetRequest, LabelQuery, LabelTerm, ListOptions, ListRequest};
use crate::client::{TalosClient, TalosError};

/// A machine's hardware, as read in maintenance mode.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Inventory {
    /// The SMBIOS system UUID: the machine's identity.
    pub uuid: String,
    /// SMBIOS manufacturer.
    pub manufacturer: String,
    /// SMBIOS product name.
    pub product_name: String,
    /// SMBIOS serial number.
    pub serial_number: String,
    /// Block devices.
    pub disks: Vec<Disk>,
    /// Network links: the physical ones (Talos's `LinkStatusSpec.Physical`: type `ether`, no
    /// kind), not `lo` or links the OS made.
    pub links: Vec<Link>,
}

/// One block device (`Disks.block.talos.dev`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
pub struct Disk {
    /// Device name (the resource id), e.g. `sda`.
    #[serde(skip)]
    pub name: String,
    /// Device path, e.g. `/dev/sda`.
    #[serde(default)]
    pub dev_path: String,
    /// Size in bytes.
    #[serde(default)]
    pub size: u64,
    /// Model.
    #[serde(default)]
    pub model: String,
    /// Serial number.
    #[serde(default)]
    pub serial: String,
    /// WWID.
    #[serde(default)]
    pub wwid: String,
    /// Transport, e.g. `nvme`.
    #[serde(default)]
    pub transport: String,
    /// Whether it spins.
    #[serde(default)]
    pub rotational: bool,
    /// Whether it is read-only.
    #[serde(default)]
    pub readonly: bool,
    /// Whether it is a CD-ROM.
    #[serde(default)]
    pub cdrom: bool,
}

/// One network link (`LinkStatuses.net.talos.dev`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Link {
    /// Link name (the resource id), e.g. `eth0`.
    #[serde(skip)]
    pub name: String,
    /// Link type, e.g. `ether`, `loopback`.
    #[serde(default, rename = "type")]
    pub link_type: String,
    /// MAC address.
    #[serde(default)]
    pub hardware_addr: String,
    /// Operational state, e.g. `up`.
    #[serde(default)]
    pub operational_state: String,
    /// Link kind (empty for physical links).
    #[serde(default)]
    pub kind: String,
    /// Driver.
    #[serde(default)]
    pub driver: String,
}

impl Link {
    /// Whether the link is hardware: type `ether` with no kind (Talos's
    /// `LinkStatusSpec.Physical`, talos-facts §13.5).
    pub fn is_physical(&self) -> bool {
        self.link_type == "ether" && self.kind.is_empty()
    }
}

/// The machine's stage (talos-facts §3, `RuntimeMachineStage` in YAML form).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stage {
    /// `unknown`.
    Unknown,
    /// `booting`.
    Booting,
    /// `installing`.
    Installing,
    /// `maintenance`: no complete config yet.
    Maintenance,
    /// `running`.
    Running,
    /// `rebooting`.
    Rebooting,
    /// `shutting down`.
    ShuttingDown,
    /// `resetting`.
    Resetting,
    /// `upgrading`.
    Upgrading,
}

impl Stage {
    pub(crate) fn parse(text: &str) -> Self {
        match text {
            "booting" => Self::Booting,
            "installing" => Self::Installing,
            "maintenance" => Self::Maintenance,
            "running" => Self::Running,
            "rebooting" => Self::Rebooting,
            "shutting down" => Self::ShuttingDown,
            "resetting" => Self::Resetting,
            "upgrading" => Self::Upgrading,
            _ => Self::Unknown,
        }
    }
}

/// `UnattendedInstallStatuses.runtime.talos.dev/unattended-install` (1.14, talos-facts §3,
/// §8.2).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnattendedInstall {
    /// The installer image.
    pub image: String,
    /// The phase: `pending`, `installing`, `installed`, `waiting-for-reboot` or `failed`.
    pub phase: String,
    /// Why it is pending, or the error when failed.
    pub error: String,
}

/// One user volume as the node reports it (its `VolumeStatus` `u-<name>`, talos-facts / crates/ichor-sim/docs/user-volumes.md).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UserVolumeStatus {
    /// The volume's name, without the `u-` prefix.
    pub name: String,
    /// Talos's phase, lowercase (`ready`, `failed`, `waiting`, ...).
    pub phase: String,
    /// Its size as Talos prints it (`prettySize`), when known.
    pub size: Option<String>,
    /// Where it lives (`location`), when known.
    pub location: Option<String>,
    /// Talos's error message, when there is one.
    pub error: Option<String>,
}

/// The label Talos puts on the volume resources of user volumes (`block.UserVolumeLabel`,
/// `pkg/machinery/resources/block/block.go`).
/// One system extension on a node: an `ExtensionStatuses.runtime.talos.dev` resource's
/// `metadata` (talos-facts §9.5).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Extension {
    /// Its name: an official extension's without the factory's `siderolabs/` prefix (e.g.
    /// `intel-ucode`), or `schematic` for the Image Factory's virtual extension.
    pub name: String,
    /// Its version; the `schematic` extension's is the schematic ID.
    pub version: String,
}

/// The name of the Image Factory's virtual extension, whose version is the schematic ID of
/// the image the node was installed or upgraded with (talos-facts §9.5).
pub const SCHEMATIC_EXTENSION: &str = "schematic";

const USER_VOLUME_LABEL: &str = "talos.dev/user-volume";

/// The id prefix of user volumes (`constants.UserVolumePrefix`,
/// `pkg/machinery/constants/constants.go`).
const USER_VOLUME_PREFIX: &str = "u-";

/// `MachineStatuses.runtime.talos.dev/machine`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MachineStatus {
    /// The stage.
    pub stage: Stage,
    /// `status.ready` (not `spec.ready`): true only when running with nothing unmet.
    pub ready: bool,
    /// Unmet readiness conditions: (name, reason).
    pub unmet: Vec<(String, String)>,
}

impl TalosClient {
    fn state(&self) -> StateClient<crate::client::Observed> {
        StateClient::new(self.transport())
    }

    /// The spec of one resource.
    async fn get_spec(&self, namespace: &str, type_: &str, id: &str) -> Result<Value, TalosError> {
        const METHOD: &str = "COSI Get";
        let response = self
            .state()
            .get(self.request(GetRequest {
                namespace: namespace.into(),
                r#type: type_.into(),
                id: id.into(),
                options: None,
            }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let resource = response
            .resource
            .ok_or_else(|| self.node_error(METHOD, format!("no {type_}/{id} in the reply")))?;
        crate::decode::resource_spec(&resource).map_err(|e| self.node_error(METHOD, e))
    }

    /// Every resource of a type: (id, spec).
    pub(crate) async fn list_specs(
        &self,
        namespace: &str,
        type_: &str,
    ) -> Result<Vec<(String, Value)>, TalosError> {
        self.list_specs_where(namespace, type_, None).await
    }

    /// Every resource of a type the options select: (id, spec).
    async fn list_specs_where(
        &self,
        namespace: &str,
        type_: &str,
        options: Option<ListOptions>,
    ) -> Result<Vec<(String, Value)>, TalosError> {
        const METHOD: &str = "COSI List";
        let mut stream = self
            .state()
            .list(self.request(ListRequest {
                namespace: namespace.into(),
                r#type: type_.into(),
                options,
            }))
            .await
            .map_err(self.rpc_error(METHOD))?
            .into_inner();
        let mut out = Vec::new();
        while let Some(item) = stream.next().await {
            let resource = item
                .map_err(self.rpc_error(METHOD))?
                .resource
                .unwrap_or_default();
            let id = resource
                .metadata
                .as_ref()
                .map(|m| m.id.clone())
                .unwrap_or_default();
            out.push((
                id,
                crate::decode::resource_spec(&resource).map_err(|e| self.node_error(METHOD, e))?,
            ));
        }
        Ok(out)
    }

    /// The machine's SMBIOS system UUID, its identity (talos-facts §8.1): one COSI Get of
    /// `SystemInformation`, for the check before a destructive step. A node that reports none
    /// is an error.
    pub async fn system_uuid(&self) -> Result<String, TalosError> {
        let system = self
            .get_spec(
                "hardware",
                "SystemInformations.hardware.talos.dev",
                "systeminformation",
            )
            .await?;
        match system["uuid"].as_str().map(str::trim) {
            Some(uuid) if !uuid.is_empty() => Ok(uuid.to_owned()),
            _ => Err(self.node_error("COSI Get", "SystemInformation has no uuid".into())),
        }
    }

    /// The machine's hardware: SMBIOS identity, disks and links.
    pub async fn inventory(&self) -> Result<Inventory, TalosError> {
        let system = self
            .get_spec(
                "hardware",
                "SystemInformations.hardware.talos.dev",
                "systeminformation",
            )
            .await?;
        let text = |key: &str| system[key].as_str().unwrap_or_default().to_owned();
        let uuid = text("uuid");
        if uuid.is_empty() {
            return Err(self.node_error("COSI Get", "SystemInformation has no uuid".into()));
        }
        let mut disks = Vec::new();
        for (id, spec) in self.list_specs("runtime", "Disks.block.talos.dev").await? {
            disks.push(crate::decode::disk(id, spec).map_err(|e| self.node_error("COSI List", e))?);
        }
        let mut links = Vec::new();
        for (id, spec) in self
            .list_specs("network", "LinkStatuses.net.talos.dev")
            .await?
        {
            let link =
                crate::decode::link(id, spec).map_err(|e| self.node_error("COSI List", e))?;
            if link.is_physical() {
                links.push(link);
            }
        }
        Ok(Inventory {
            uuid,
            manufacturer: text("manufacturer"),
            product_name: text("productName"),
            serial_number: text("serialnumber"),
            disks,
            links,
        })
    }

    /// The node's running machine config, as the YAML it was applied as: the
    /// `MachineConfigs.config.talos.dev` resource `v1alpha1` in namespace `config`, whose spec is
    /// the config as one YAML string (talos-facts §13.4; the table of resources). The type is
    /// sensitive: it needs os:admin. A node without a config has no such resource.
    pub async fn live_config(&self) -> Result<String, TalosError> {
        let spec = self
            .get_spec("config", "MachineConfigs.config.talos.dev", "v1alpha1")
            .await?;
        spec.as_str().map(str::to_owned).ok_or_else(|| {
            self.node_error(
                "COSI Get",
                "the MachineConfig resource's spec is not the config's YAML".into(),
            )
        })
    }

    /// The machine's stage and readiness.
    pub async fn machine_status(&self) -> Result<MachineStatus, TalosError> {
        let spec = self
            .get_spec("runtime", "MachineStatuses.runtime.talos.dev", "machine")
            .await?;
        Ok(crate::decode::machine_status(&spec))
    }

    /// The node's user volumes, by name.
    ///
    /// Reads the `VolumeStatuses.block.talos.dev` resources labelled `talos.dev/user-volume`
    /// in namespace `runtime`: one per `UserVolumeConfig` document of the running config, with
    /// id `u-<name>` (`UserVolumeTransformer`,
    /// `internal/app/machined/pkg/controllers/block/internal/volumes/volumeconfig/user_volumes.go`).
    /// A node without user volumes has none.
    pub async fn user_volumes(&self) -> Result<Vec<UserVolumeStatus>, TalosError> {
        let options = ListOptions {
            label_query: vec![LabelQuery {
                terms: vec![LabelTerm {
                    key: USER_VOLUME_LABEL.into(),
                    op: Operation::Exists as i32,
                    value: Vec::new(),
                    invert: false,
                }],
            }],
            id_query: None,
        };
        let mut volumes: Vec<UserVolumeStatus> = self
            .list_specs_where("runtime", "VolumeStatuses.block.talos.dev", Some(options))
            .await?
            .into_iter()
            .filter_map(|(id, spec)| {
                let name = id.strip_prefix(USER_VOLUME_PREFIX)?.to_owned();
                // Every key but `phase` and `type` is omitempty (`VolumeStatusSpec`,
                // `pkg/machinery/resources/block/volume_status.go`).
                let text = |key: &str| {
                    spec[key]
                        .as_str()
                        .filter(|v| !v.is_empty())
                        .map(str::to_owned)
                };
                Some(UserVolumeStatus {
                    name,
                    phase: text("phase").unwrap_or_else(|| "waiting".into()),
                    size: text("prettySize"),
                    location: text("location"),
                    error: text("errorMessage"),
                })
            })
            .collect();
        volumes.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(volumes)
    }

    /// The node's system extensions, in the order Talos lists them (by layer id, as strings).
    ///
    /// Reads `ExtensionStatuses.runtime.talos.dev` in namespace `runtime` (os:reader; the same
    /// in 1.13 and 1.14): one resource per layer of the installer the node was installed or
    /// last upgraded with, whose spec is the layer's manifest metadata (talos-facts §9.5).
    /// Layer ids are not stable: an extension is known by its name.
    pub async fn extensions(&self) -> Result<Vec<Extension>, TalosError> {
        Ok(self
            .list_specs("runtime", "ExtensionStatuses.runtime.talos.dev")
            .await?
            .into_iter()
            .map(|(_, spec)| {
                let text = |key: &str| {
                    spec["metadata"][key]
                        .as_str()
                        .unwrap_or_default()
                        .to_owned()
                };
                Extension {
                    name: text("name"),
                    version: text("version"),
                }
            })
            .collect())
    }

    /// The schematic ID of the Image Factory image the node was installed or upgraded with:
    /// the version of its `schematic` extension (talos-facts §9.5), or `None` when it has none
    /// (an installer not built by the factory, such as `ghcr.io/siderolabs/installer`).
    pub async fn schematic_id(&self) -> Result<Option<String>, TalosError> {
        Ok(self
            .extensions()
            .await?
            .into_iter()
            .find(|e| e.name == SCHEMATIC_EXTENSION && !e.version.is_empty())
            .map(|e| e.version))
    }

    /// The unattended install's status (1.14), or `None` when the node has none: no install
    /// started, or a version without the resource type (Talos answers `NotFound` or, for an
    /// unknown type, `PermissionDenied`).
    pub async fn unattended_install(&self) -> Result<Option<UnattendedInstall>, TalosError> {
        match self
            .get_spec(
                "runtime",
                "UnattendedInstallStatuses.runtime.talos.dev",
                "unattended-install",
            )
            .await
        {
            Ok(spec) => {
                let text = |key: &str| spec[key].as_str().unwrap_or_default().to_owned();
                // Every key is omitempty; the zero phase, pending, is left out (talos-facts
                // §13.6, §11.7).
                let phase = spec["phase"].as_str().unwrap_or("pending").to_owned();
                Ok(Some(UnattendedInstall {
                    image: text("image"),
                    phase,
                    error: text("error"),
                }))
            }
            Err(e)
                if e.code() == Some(tonic::Code::NotFound)
                    || matches!(&e, TalosError::Rpc { status, .. }
                        if status.code() == tonic::Code::PermissionDenied
                            && status.message().contains("not supported")) =>
            {
                Ok(None)
            }
            Err(e) => Err(e),
        }
    }
}
