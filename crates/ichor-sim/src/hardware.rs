//! A simulated machine's hardware, and the COSI resources that describe it (talos-facts §3,
//! §8.1), as a node in maintenance mode serves them to `os:reader`.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// One block device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimDisk {
    /// Device name, e.g. `vda`.
    pub name: String,
    /// Size in bytes.
    pub size: u64,
    /// Whether it is a CD-ROM (the boot ISO).
    pub cdrom: bool,
    /// Transport, e.g. `virtio`.
    pub transport: String,
    /// Model.
    pub model: String,
    /// Serial number.
    pub serial: String,
}

/// One network link.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimLink {
    /// Link name, e.g. `eth0`.
    pub name: String,
    /// MAC address.
    pub hardware_addr: String,
}

/// What a simulated machine is made of.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hardware {
    /// The SMBIOS system UUID.
    pub uuid: String,
    /// Its disks.
    pub disks: Vec<SimDisk>,
    /// Its links.
    pub links: Vec<SimLink>,
}

impl Hardware {
    /// A small VM: the boot CD `sr0`, a 100 GB `vda`, one link `eth0`; identity from `seed`.
    pub fn vm(seed: u32) -> Self {
        Self {
            uuid: format!("5a1a0000-0000-4000-8000-{seed:012x}"),
            disks: vec![
                SimDisk {
                    name: "sr0".into(),
                    size: 100 * 1024 * 1024,
                    cdrom: true,
                    transport: "sata".into(),
                    model: "QEMU DVD-ROM".into(),
                    serial: String::new(),
                },
                SimDisk {
                    name: "vda".into(),
                    size: 100_000_000_000,
                    cdrom: false,
                    transport: "virtio".into(),
                    model: String::new(),
                    serial: format!("SIM{seed:08}"),
                },
            ],
            links: vec![SimLink {
                name: "eth0".into(),
                hardware_addr: format!(
                    "52:54:00:{:02x}:{:02x}:{:02x}",
                    (seed >> 16) & 0xff,
                    (seed >> 8) & 0xff,
                    seed & 0xff
                ),
            }],
        }
    }
}

/// A COSI resource: namespace, type, id, its spec as Talos marshals it to YAML, and the
/// protobuf encoding of its spec where Ichor's proto/ defines the message.
#[derive(Debug, Clone)]
pub(crate) struct SimResource {
    pub(crate) namespace: &'static str,
    pub(crate) type_: &'static str,
    pub(crate) id: String,
    pub(crate) spec: Value,
    pub(crate) proto: Vec<u8>,
}

/// The resources describing the hardware (talos-facts §3, §8.1), by lowercased type (§1.6:
/// the server resolves a type by its lowercased full name).
pub(crate) fn hardware_resources(hardware: &Hardware) -> BTreeMap<String, Vec<SimResource>> {
    use ichor_talos::api::resource::definitions::hardware::SystemInformationSpec;
    use prost::Message as _;
    let mut out: BTreeMap<String, Vec<SimResource>> = BTreeMap::new();
    let mut add =
        |namespace: &'static str, type_: &'static str, id: String, spec: Value, proto: Vec<u8>| {
            out.entry(type_.to_lowercase())
                .or_default()
                .push(SimResource {
                    namespace,
                    type_,
                    id,
                    spec,
                    proto,
                });
        };
    // §8.1: SMBIOS identity; YAML keys as Talos writes them (serialnumber all lowercase).
    let smbios = SystemInformationSpec {
        manufacturer: "QEMU".into(),
        product_name: "Standard PC (Q35 + ICH9, 2009)".into(),
        version: "pc-q35".into(),
        serial_number: String::new(),
        uuid: hardware.uuid.clone(),
        wake_up_type: "Power Switch".into(),
        sku_number: String::new(),
        bios_version: String::new(),
    };
    add(
        "hardware",
        "SystemInformations.hardware.talos.dev",
        "systeminformation".into(),
        json!({
            "manufacturer": smbios.manufacturer,
            "productName": smbios.product_name,
            "version": smbios.version,
            "serialnumber": smbios.serial_number,
            "uuid": smbios.uuid,
            "wakeUpType": smbios.wake_up_type,
            "skuNumber": smbios.sku_number
        }),
        smbios.encode_to_vec(),
    );
    // §3: Disks.block.talos.dev, snake_case keys, one resource per device.
    for disk in &hardware.disks {
        add(
            "runtime",
            "Disks.block.talos.dev",
            disk.name.clone(),
            json!({
                "dev_path": format!("/dev/{}", disk.name),
                "size": disk.size,
                "readonly": false,
                "cdrom": disk.cdrom,
                "model": disk.model,
                "serial": disk.serial,
                "transport": disk.transport,
                "rotational": false
            }),
            Vec::new(),
        );
    }
    // §3: LinkStatuses.net.talos.dev, camelCase keys.
    for (index, link) in hardware.links.iter().enumerate() {
        add(
            "network",
            "LinkStatuses.net.talos.dev",
            link.name.clone(),
            json!({
                "index": index + 2,
                "type": "ether",
                "hardwareAddr": link.hardware_addr,
                "permanentAddr": link.hardware_addr,
                "mtu": 1500,
                "operationalState": "up",
                "linkState": true,
                "kind": "",
                "driver": "virtio_net"
            }),
            Vec::new(),
        );
    }
    out
}

/// Resource types whose reads need `os:admin` (talos-facts §1.6: sensitive types).
pub(crate) fn is_sensitive(type_lowercase: &str) -> bool {
    type_lowercase == "machineconfigs.config.talos.dev"
        || type_lowercase.ends_with(".secrets.talos.dev")
}

impl Hardware {
    /// The disk Talos installs to here: the first writable disk.
    pub(crate) fn install_disk(&self) -> Option<&SimDisk> {
        self.disks.iter().find(|d| !d.cdrom)
    }
}
