//! A simulated machine's hardware: its identity, disks and links (the COSI resources that
//! describe it are in `cosi::block` and `cosi::network`, talos-facts §8.1, §13.5).

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

impl Hardware {
    /// The disk Talos installs to here: the first writable disk.
    pub(crate) fn install_disk(&self) -> Option<&SimDisk> {
        self.disks.iter().find(|d| !d.cdrom)
    }
}
