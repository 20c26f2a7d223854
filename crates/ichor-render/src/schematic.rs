//! Image Factory schematics: their IDs, computed exactly as the factory computes them, and the
//! installer images the factory serves for them.
//!
//! The factory's ID of a schematic is the lowercase hex SHA-256 of the schematic marshalled
//! with go-yaml (talos-facts §9.2): keys in the factory's struct order, four spaces per level,
//! a sequence's `- ` four spaces deeper than its key, an empty `customization` written `{}`,
//! nothing sorted or de-duplicated. [`canonical_yaml`] writes those bytes for the part of the
//! schematic Ichor declares (extensions, kernel arguments, META values, bootloader), and
//! refuses a string whose quoting it cannot be sure of: one YAML would read as a bool, a
//! number or null (go-yaml's quoting of those changed between versions), one with line breaks,
//! control or non-ASCII characters, or spaces at either end.
//!
//! ```
//! use ichor_api::schematic::{ImageFactorySpec, Schematic};
//! use ichor_render::schematic;
//!
//! // The empty schematic is the factory's default (talos-facts §9.4).
//! assert_eq!(schematic::id(&Schematic::default())?, schematic::EMPTY_ID);
//! let gvisor = Schematic {
//!     system_extensions: vec!["siderolabs/gvisor".into()],
//!     ..Schematic::default()
//! };
//! let id = schematic::id(&gvisor)?;
//! assert_eq!(
//!     schematic::installer_image(&ImageFactorySpec::default(), &id, "v1.14.1"),
//!     format!("factory.talos.dev/metal-installer/{id}:v1.14.1")
//! );
//! # Ok::<(), schematic::SchematicError>(())
//! ```

use std::fmt::Write as _;
use std::sync::LazyLock;

use ichor_api::schematic::{ImageFactorySpec, LOOKALIKE, MetaValue, Schematic};

/// The ID of the empty schematic: the factory's default, and Talos 1.14's default installer's
/// (talos-facts §9.2, §9.4).
pub const EMPTY_ID: &str = "376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba";

/// A schematic whose ID cannot be computed exactly.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {value:?}: {reason}")]
pub struct SchematicError {
    /// The field, e.g. `schematic.meta[0].value`.
    pub field: String,
    /// The value refused.
    pub value: String,
    /// Why, and what is allowed.
    pub reason: &'static str,
}

static LOOKS_LIKE_ANOTHER_TYPE: LazyLock<regex::Regex> =
    LazyLock::new(|| regex::Regex::new(LOOKALIKE).expect("LOOKALIKE is a valid regex"));

/// How go-yaml writes `value` in a block mapping or sequence (its emitter's scalar analysis,
/// talos-facts §9.2): plain when no character makes it an indicator, else single-quoted.
fn scalar(field: impl Fn() -> String, value: &str) -> Result<String, SchematicError> {
    let refuse = |reason| {
        Err(SchematicError {
            field: field(),
            value: value.to_owned(),
            reason,
        })
    };
    if value.is_empty() {
        return refuse("must not be empty");
    }
    if !value.chars().all(|c| c.is_ascii() && !c.is_ascii_control()) {
        return refuse(
            "must be one line of printable ASCII characters (write a network configuration as JSON)",
        );
    }
    if value.starts_with(' ') || value.ends_with(' ') {
        return refuse("must not start or end with a space");
    }
    if LOOKS_LIKE_ANOTHER_TYPE.is_match(value) {
        return refuse(
            "reads as a YAML bool, number, date or null, which the factory quotes in a way that changes the schematic ID; wrap it, e.g. as JSON",
        );
    }
    if plain_allowed(value) {
        Ok(value.to_owned())
    } else {
        Ok(format!("'{}'", value.replace('\'', "''")))
    }
}

/// Whether go-yaml's emitter may write `value` (printable ASCII, one line, no space at either
/// end) plain in block context: no indicator at its start, no `: ` or ` #` inside, no `:` at
/// its end, and not a document marker (libyaml's `analyze_scalar`).
fn plain_allowed(value: &str) -> bool {
    if value.starts_with("---") || value.starts_with("...") {
        return false;
    }
    let bytes = value.as_bytes();
    let blank_after = |i: usize| bytes.get(i + 1).is_none_or(|b| *b == b' ');
    for (i, byte) in bytes.iter().enumerate() {
        let indicator = if i == 0 {
            b"#,[]{}&*!|>'\"%@`".contains(byte)
                || (matches!(byte, b'?' | b':' | b'-') && blank_after(i))
        } else {
            (*byte == b':' && blank_after(i)) || (*byte == b'#' && bytes[i - 1] == b' ')
        };
        if indicator {
            return false;
        }
    }
    true
}

/// The bytes the factory hashes for `schematic`: go-yaml's marshalling of it (talos-facts
/// §9.2).
pub fn canonical_yaml(schematic: &Schematic) -> Result<String, SchematicError> {
    let mut body = String::new();
    if !schematic.extra_kernel_args.is_empty() {
        body.push_str("    extraKernelArgs:\n");
        for (i, arg) in schematic.extra_kernel_args.iter().enumerate() {
            let arg = scalar(|| format!("schematic.extraKernelArgs[{i}]"), arg)?;
            let _ = writeln!(body, "        - {arg}");
        }
    }
    if !schematic.meta.is_empty() {
        body.push_str("    meta:\n");
        for (i, MetaValue { key, value }) in schematic.meta.iter().enumerate() {
            let value = scalar(|| format!("schematic.meta[{i}].value"), value)?;
            let _ = writeln!(body, "        - key: {key}\n          value: {value}");
        }
    }
    if !schematic.system_extensions.is_empty() {
        body.push_str("    systemExtensions:\n        officialExtensions:\n");
        for (i, name) in schematic.system_extensions.iter().enumerate() {
            let name = scalar(|| format!("schematic.systemExtensions[{i}]"), name)?;
            let _ = writeln!(body, "            - {name}");
        }
    }
    if let Some(bootloader) = schematic.bootloader {
        let _ = writeln!(body, "    bootloader: {}", bootloader.as_str());
    }
    Ok(if body.is_empty() {
        "customization: {}\n".to_owned()
    } else {
        format!("customization:\n{body}")
    })
}

/// The schematic's ID, as the factory computes it: the hex SHA-256 of [`canonical_yaml`].
pub fn id(schematic: &Schematic) -> Result<String, SchematicError> {
    let yaml = canonical_yaml(schematic)?;
    let digest = ring::digest::digest(&ring::digest::SHA256, yaml.as_bytes());
    Ok(digest.as_ref().iter().fold(String::new(), |mut hex, b| {
        let _ = write!(hex, "{b:02x}");
        hex
    }))
}

/// The factory's installer image for schematic `id` and Talos `version` on bare metal:
/// `<registry>/metal-installer[-secureboot]/<id>:<version>` (talos-facts §9.4).
pub fn installer_image(factory: &ImageFactorySpec, id: &str, version: &str) -> String {
    let flavour = if factory.secure_boot {
        "metal-installer-secureboot"
    } else {
        "metal-installer"
    };
    format!("{}/{flavour}/{id}:{version}", factory.registry())
}

/// An installer image of the factory's, split: the registry, whether it is the Secure Boot
/// flavour, the schematic ID and the tag. `None` for any other image.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactoryImage<'a> {
    /// The registry host (and port).
    pub registry: &'a str,
    /// The platform, e.g. `metal` (empty for the legacy `installer` names).
    pub platform: &'a str,
    /// Whether it is a `-secureboot` installer.
    pub secure_boot: bool,
    /// The schematic ID.
    pub schematic: &'a str,
    /// The tag: the Talos version.
    pub tag: &'a str,
}

impl<'a> FactoryImage<'a> {
    /// Reads `image` as `<registry>/[<platform>-]installer[-secureboot]/<64 hex>:<tag>`
    /// (talos-facts §9.4).
    pub fn parse(image: &'a str) -> Option<Self> {
        let (registry, rest) = image.split_once('/')?;
        let (name, rest) = rest.split_once('/')?;
        let (schematic, tag) = rest.split_once(':')?;
        let (name, secure_boot) = match name.strip_suffix("-secureboot") {
            Some(name) => (name, true),
            None => (name, false),
        };
        let platform = match name.strip_suffix("installer")? {
            "" => "",
            prefixed => prefixed.strip_suffix('-').filter(|p| !p.is_empty())?,
        };
        let hex = schematic.len() == 64
            && schematic
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b));
        (hex && !tag.is_empty() && !tag.contains('/')).then_some(Self {
            registry,
            platform,
            secure_boot,
            schematic,
            tag,
        })
    }
}

#[cfg(test)]
mod tests {
    use ichor_api::schematic::Bootloader;

    use super::*;

    fn args(list: &[&str]) -> Schematic {
        Schematic {
            extra_kernel_args: list.iter().map(|a| (*a).to_owned()).collect(),
            ..Schematic::default()
        }
    }

    fn extensions(list: &[&str]) -> Schematic {
        Schematic {
            system_extensions: list.iter().map(|a| (*a).to_owned()).collect(),
            ..Schematic::default()
        }
    }

    fn meta(value: &str) -> Schematic {
        Schematic {
            meta: vec![MetaValue {
                key: 0xa,
                value: value.to_owned(),
            }],
            ..Schematic::default()
        }
    }

    /// The factory's own pairs of schematic and ID (talos-facts §9.2, with their sources).
    #[test]
    fn ids_are_the_factorys_own() {
        let cases = [
            (Schematic::default(), EMPTY_ID),
            (
                args(&["noapic", "nolapic"]),
                "9cba8e32753f91a16c1837ab8abf356af021706ef284aef07380780177d9a06c",
            ),
            (
                args(&["nolapic", "nomodeset"]),
                "e0fb1129bbbdfb5d002e94af4cdce712a8370e850950a33a242d4c3f178c532d",
            ),
            (
                meta("foo"),
                "d308a2a5ee2277bed5fbaa104fcbc8d59122abfa737df987a95b4ca763459a7f",
            ),
            (
                meta(r#"{"externalIPs":["1.2.3.4"]}"#),
                "fe866116408a5a13dab7d5003eb57a00954ea81ebeec3fbbcd1a6d4462a00036",
            ),
            (
                Schematic {
                    bootloader: Some(Bootloader::Grub),
                    ..Schematic::default()
                },
                "39d496b2cbdb6265d3b714514c5334bf010f1b4d31b23b9e38c80fb2f3ad7ecb",
            ),
            (
                Schematic {
                    bootloader: Some(Bootloader::SdBoot),
                    ..Schematic::default()
                },
                "9ed5fecdacb36b5c5427b87d409f1065cfb2df69b0f71c58b868d9d466d8dab3",
            ),
            (
                extensions(&[
                    "siderolabs/amd-ucode",
                    "siderolabs/gvisor",
                    "siderolabs/gasket-driver",
                ]),
                "51ff3e49313773332729a5c04e57af0dbe2e6d3f65ff638e6d4c3a05065fefff",
            ),
            (
                Schematic {
                    extra_kernel_args: vec!["net.ifnames=0".into()],
                    system_extensions: vec![
                        "siderolabs/gvisor".into(),
                        "siderolabs/intel-ucode".into(),
                    ],
                    ..Schematic::default()
                },
                "b8e8fbbe1b520989e6c52c8dc8303070cb42095997e76e812fa8892393e1d176",
            ),
            (
                extensions(&["siderolabs/gvisor"]),
                "d9ff89777e246792e7642abd3220a616afb4e49822382e4213a2e528ab826fe5",
            ),
        ];
        for (schematic, expected) in cases {
            assert_eq!(id(&schematic).unwrap(), expected, "{schematic:?}");
        }
    }

    #[test]
    fn the_order_of_extensions_is_part_of_the_id() {
        let one = id(&extensions(&[
            "siderolabs/gvisor",
            "siderolabs/intel-ucode",
        ]))
        .unwrap();
        let other = id(&extensions(&[
            "siderolabs/intel-ucode",
            "siderolabs/gvisor",
        ]))
        .unwrap();
        assert_ne!(one, other);
    }

    #[test]
    fn strings_are_plain_unless_an_indicator_makes_them_quoted() {
        let quoted = |v: &str| scalar(String::new, v).unwrap();
        for plain in [
            "console=ttyS0,115200",
            "a#b",
            "a:b",
            "talos.platform=metal",
            "-x",
        ] {
            assert_eq!(quoted(plain), plain);
        }
        for (value, written) in [
            ("#x", "'#x'"),
            ("a #b", "'a #b'"),
            ("a: b", "'a: b'"),
            ("a:", "'a:'"),
            ("- a", "'- a'"),
            ("it's", "it's"),
            ("'x'", "'''x'''"),
            ("---x", "'---x'"),
            ("@x", "'@x'"),
        ] {
            assert_eq!(quoted(value), written, "{value}");
        }
    }

    #[test]
    fn strings_whose_quoting_is_uncertain_are_refused_naming_the_field() {
        for value in [
            "",
            "yes",
            "No",
            "on",
            "true",
            "null",
            "~",
            "10",
            "1:20",
            "-1",
            ".5",
            ".inf",
            "2026-12-06",
            " x",
            "x ",
            "a\nb",
            "tab\t",
            "é",
        ] {
            let refused = canonical_yaml(&meta(value)).unwrap_err();
            assert_eq!(refused.field, "schematic.meta[0].value", "{value:?}");
        }
        let refused = id(&args(&["quiet", "off"])).unwrap_err();
        assert_eq!(refused.field, "schematic.extraKernelArgs[1]");
        assert!(refused.to_string().contains("\"off\""), "{refused}");
    }

    #[test]
    fn installer_images_name_the_factory_the_flavour_the_schematic_and_the_version() {
        let factory = ImageFactorySpec {
            url: "http://127.0.0.1:8080/".into(),
            secure_boot: true,
        };
        let image = installer_image(&factory, EMPTY_ID, "v1.14.2");
        assert_eq!(
            image,
            format!("127.0.0.1:8080/metal-installer-secureboot/{EMPTY_ID}:v1.14.2")
        );
        assert_eq!(
            FactoryImage::parse(&image),
            Some(FactoryImage {
                registry: "127.0.0.1:8080",
                platform: "metal",
                secure_boot: true,
                schematic: EMPTY_ID,
                tag: "v1.14.2",
            })
        );
        let legacy = format!("factory.talos.dev/installer/{EMPTY_ID}:v1.13.9");
        assert_eq!(FactoryImage::parse(&legacy).map(|i| i.platform), Some(""));
        for other in [
            "ghcr.io/siderolabs/installer:v1.13.9",
            "factory.talos.dev/metal-installer/abc:v1.14.0",
            "factory.talos.dev/-installer/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1",
            "factory.talos.dev/metal-imager/376567988ad370138ad8b2698212367b8edcb69b5fd68c80be1f2ec7d603b4ba:v1",
        ] {
            assert_eq!(FactoryImage::parse(other), None, "{other}");
        }
    }
}
