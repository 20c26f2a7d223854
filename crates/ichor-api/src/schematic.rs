//! Image Factory schematics: the system extensions, kernel arguments and META values a node's
//! installer is built with (talos-facts §9.1), and the factory that builds it.
//!
//! A schematic is declared on the TalosCluster (`spec.schematic`) and may be replaced, whole, by
//! a TalosMachineClass's or a TalosMachine's (the most specific one applies, ADR 0067). The
//! installer image of a machine is then `<factory host>/metal-installer/<schematic ID>:<Talos
//! version>` (talos-facts §9.4); `install.image` set explicitly opts out of all of this.
//!
//! Every string of a schematic is limited to what Ichor can hash exactly as the factory does
//! (talos-facts §9.2): a value YAML would have to quote, or read as a bool, a number or null,
//! is refused at the door.

use kube::KubeSchema;
use serde::{Deserialize, Serialize};

/// The default Image Factory.
pub const DEFAULT_FACTORY: &str = "https://factory.talos.dev";

/// The strings that stay plain (unquoted) in the factory's YAML: letters, digits and
/// `_ . / = , + @ ~ : -`, starting with a letter, `_` or `/`, not ending in `:`
/// (talos-facts §9.2). RE2, as CEL's `matches` reads it.
pub const PLAIN: &str = r"^[A-Za-z_/][A-Za-z0-9_./=,+@~:-]*$";

/// The strings YAML could read as something else than a string (a bool, a number, a date,
/// null, a merge key): the factory quotes them in a way its YAML library has changed between
/// versions, so their IDs cannot be computed here (talos-facts §9.2). Wider than YAML's own
/// rules, to be safe: anything starting with a digit (after a sign or a dot) is one. RE2,
/// case-insensitive.
pub const LOOKALIKE: &str =
    r"^(?i)(y|yes|n|no|true|false|on|off|null|~|<<|[-+]?\.(inf|nan))$|^[-+.]?[0-9]";

/// What a node's installer is built with, as the Image Factory reads it (talos-facts §9.1).
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Schematic {
    /// Official system extensions, by the factory's name, e.g. `siderolabs/intel-ucode`. The
    /// order is kept (it is part of the schematic's ID).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(
        length(max = 64),
        inner(length(min = 1, max = 128), regex(pattern = r"^[a-z][a-z0-9._/-]*$"))
    )]
    #[x_kube(validation = Rule::new("self.all(x, self.exists_one(y, y == x))").message("schematic.systemExtensions must not name an extension twice"))]
    pub system_extensions: Vec<String>,
    /// Extra kernel arguments, e.g. `net.ifnames=0` (Talos 1.10 and later put them in the
    /// installer, talos-facts §9.4).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 64), inner(length(min = 1, max = 256)))]
    #[x_kube(validation = Rule::new(format!("self.all(a, a.matches(r'{PLAIN}') && !a.endsWith(':') && !a.matches(r'{LOOKALIKE}'))")).message("each schematic.extraKernelArgs entry must be one argument of letters, digits and _ . / = , + @ ~ : -, starting with a letter, _ or /, e.g. net.ifnames=0 (not yes, no, on, off, true, false or null)"))]
    pub extra_kernel_args: Vec<String>,
    /// Values written to the node's META partition at install, e.g. key `10` (0xa) with a
    /// network configuration.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(length(max = 16))]
    pub meta: Vec<MetaValue>,
    /// The bootloader of the disk images (`sd-boot`, `grub` or `dual-boot`); the factory
    /// chooses when unset.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bootloader: Option<Bootloader>,
}

/// One META value.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MetaValue {
    /// The META key, 0 to 255 (e.g. 10 for the network configuration, 0xa).
    #[schemars(range(min = 0, max = 255))]
    pub key: u8,
    /// The value, on one line (a network configuration as JSON, for instance).
    #[schemars(length(min = 1, max = 4096))]
    #[x_kube(validation = Rule::new(r"!self.matches(r'[\x00-\x1f\x7f]') && !self.matches(r'^\s|\s$')").message("schematic.meta value must be one line of printable characters, without leading or trailing spaces (write a network configuration as JSON)"), validation = Rule::new(format!("!self.matches(r'{LOOKALIKE}')")).message("schematic.meta value must not read as a YAML bool, number, date or null (the factory would quote it in a way that changes the schematic ID); wrap it, e.g. as JSON"))]
    pub value: String,
}

/// The bootloader of a schematic's disk images (talos-facts §9.1).
#[derive(schemars::JsonSchema, Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Bootloader {
    /// systemd-boot (UEFI).
    SdBoot,
    /// GRUB.
    Grub,
    /// Both: systemd-boot for UEFI, GRUB for BIOS.
    DualBoot,
}

impl Bootloader {
    /// The value as the factory writes it.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::SdBoot => "sd-boot",
            Self::Grub => "grub",
            Self::DualBoot => "dual-boot",
        }
    }
}

/// The Image Factory installers are built by and schematics registered with.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ImageFactorySpec {
    /// The factory's URL, e.g. `https://factory.talos.dev` (the default) or a private,
    /// air-gapped factory. Its host (and port) is the registry installer images come from.
    #[serde(default = "default_factory")]
    #[schemars(length(max = 256))]
    #[x_kube(validation = Rule::new("isURL(self) && url(self).getScheme() in ['https', 'http'] && url(self).getHostname() != '' && url(self).getEscapedPath() in ['', '/']").message("imageFactory.url must be an http(s):// URL of the factory's root, e.g. https://factory.talos.dev"))]
    pub url: String,
    /// Whether nodes boot with Secure Boot: their installers are then the factory's
    /// `metal-installer-secureboot` images.
    #[serde(default)]
    pub secure_boot: bool,
}

fn default_factory() -> String {
    DEFAULT_FACTORY.into()
}

impl Default for ImageFactorySpec {
    fn default() -> Self {
        Self {
            url: default_factory(),
            secure_boot: false,
        }
    }
}

impl ImageFactorySpec {
    /// The registry host (and port) of the factory's images: its URL without the scheme and
    /// the trailing slash, e.g. `factory.talos.dev`.
    pub fn registry(&self) -> &str {
        let url = self.url.trim_end_matches('/');
        url.split_once("://").map_or(url, |(_, rest)| rest)
    }
}
