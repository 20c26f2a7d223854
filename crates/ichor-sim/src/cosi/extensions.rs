//! A node's system extensions (talos-facts §9.5): `ExtensionStatuses.runtime.talos.dev`, one
//! per layer of the installer the node was installed or last upgraded with, and, on 1.14,
//! `ImageFactorySchematics.runtime.talos.dev`, the `schematic` extension surfaced by
//! `runtime.ImageFactorySchematicController`.
//!
//! Which installer gives which layers:
//! - an installer of the Image Factory's ([`FactoryImage::parse`]): one layer per official
//!   extension of its schematic, in schematic order, then the factory's virtual `schematic`
//!   extension (version = the schematic ID, author `Image Factory (<factory URL>)`, extraInfo =
//!   the canonical YAML; image-factory `internal/artifacts/schematic.go`). Layer ids are `0`,
//!   `1`, … in that order (`<id>.sqsh` images), listed sorted as strings. A schematic the
//!   factory does not know (a node started with such an installer) gives the `schematic`
//!   extension alone, without extraInfo;
//! - any other installer (`ghcr.io/siderolabs/installer`): none;
//! - never installed (booted from an ISO, maintenance mode, or installed and wiped): the ISO
//!   it booted: one its BMC's virtual CD held (the `bmc` module) gives its schematic's
//!   extensions as its factory installer would; otherwise the factory's default ISO, i.e. the
//!   empty schematic's `schematic` extension.
//!
//! An official extension's manifest is not something the simulator has: its on-node name is
//! the factory name without its `siderolabs/` prefix (`siderolabs/intel-ucode` →
//! `intel-ucode`), its version is the installer's tag (e.g. `v1.14.1`; real extensions carry
//! their own), author `Sidero Labs`, compatibility `>= v1.0.0` (as the extensions' manifests
//! write it, `siderolabs/extensions firmware/intel-ucode/manifest.yaml.tmpl`).

use ichor_render::schematic::{EMPTY_ID, FactoryImage};
use ichor_talos::api::resource::definitions::extensions::{
    Compatibility, Constraint, Layer, Metadata,
};
use ichor_talos::api::resource::definitions::runtime::ImageFactorySchematicSpec;
use prost::Message as _;

use super::Wanted;
use super::store::Res;
use super::yaml::{Fields, Yaml, marshal};
use crate::Node;
use crate::network::Shared;

/// The type of extension statuses.
pub(crate) const EXTENSION_STATUS: &str = "ExtensionStatuses.runtime.talos.dev";
/// The type of the Image Factory schematic (1.14).
pub(crate) const IMAGE_FACTORY_SCHEMATIC: &str = "ImageFactorySchematics.runtime.talos.dev";

/// The name of the factory's virtual extension (image-factory `pkg/constants`).
const SCHEMATIC_EXTENSION: &str = "schematic";
/// `constants.ImageFactoryName` of the community build.
const FLAVOR: &str = "Image Factory";

/// One extension's manifest metadata.
struct Extension {
    name: String,
    version: String,
    author: String,
    description: String,
    talos: String,
    extra_info: String,
}

/// The factory's `schematic` extension for schematic `id` (canonical YAML `yaml`, if known).
fn schematic_extension(id: &str, yaml: Option<String>, url: &str) -> Extension {
    Extension {
        name: SCHEMATIC_EXTENSION.into(),
        version: id.into(),
        author: format!("{FLAVOR} ({url})"),
        description: format!(
            "Virtual extension which specifies the schematic of the image built with {SCHEMATIC_EXTENSION}."
        ),
        talos: ">= 1.0.0".into(),
        extra_info: yaml.unwrap_or_default(),
    }
}

/// The extensions of the node's installer, in layer order.
fn installed(node: &Node) -> Vec<Extension> {
    let url = node.factory.url();
    let iso = node.iso.as_ref().map(crate::factory::FactoryIso::installer);
    let installer = node
        .installer
        .as_deref()
        .filter(|_| node.installed)
        .or(iso.as_deref());
    let Some(image) = installer else {
        let known = node.factory.known(EMPTY_ID).map(|k| k.yaml);
        return vec![schematic_extension(EMPTY_ID, known, &url)];
    };
    let Some(parsed) = FactoryImage::parse(image) else {
        return Vec::new();
    };
    let Some(known) = node.factory.known(parsed.schematic) else {
        return vec![schematic_extension(parsed.schematic, None, &url)];
    };
    let mut out: Vec<Extension> = known
        .schematic
        .system_extensions
        .iter()
        .map(|official| {
            let name = official
                .rsplit_once('/')
                .map_or(official.as_str(), |(_, name)| name);
            Extension {
                name: name.to_owned(),
                version: parsed.tag.to_owned(),
                author: "Sidero Labs".into(),
                description: format!("The {name} system extension."),
                talos: ">= v1.0.0".into(),
                extra_info: String::new(),
            }
        })
        .collect();
    out.push(schematic_extension(
        parsed.schematic,
        Some(known.yaml),
        &url,
    ));
    out
}

/// One `ExtensionStatus`: its spec is Talos's `extensions.Layer` (yaml keys `image`,
/// `metadata{name, version, author, description, compatibility{talos{version}}, extraInfo
/// (omitempty)}`, `pkg/machinery/extensions`).
fn extension_status(index: usize, extension: &Extension) -> Res {
    let image = format!("{index}.sqsh");
    let spec = Layer {
        image: image.clone(),
        metadata: Some(Metadata {
            name: extension.name.clone(),
            version: extension.version.clone(),
            author: extension.author.clone(),
            description: extension.description.clone(),
            compatibility: Some(Compatibility {
                talos: Some(Constraint {
                    version: extension.talos.clone(),
                }),
            }),
            extra_info: extension.extra_info.clone(),
        }),
    };
    let metadata = Fields::new()
        .field("name", Yaml::str(&extension.name))
        .field("version", Yaml::str(&extension.version))
        .field("author", Yaml::str(&extension.author))
        .field("description", Yaml::str(&extension.description))
        .field(
            "compatibility",
            Fields::new()
                .field(
                    "talos",
                    Fields::new()
                        .field("version", Yaml::str(&extension.talos))
                        .done(),
                )
                .done(),
        )
        .omitempty("extraInfo", Yaml::str(&extension.extra_info))
        .done();
    let yaml = Fields::new()
        .field("image", Yaml::str(&image))
        .field("metadata", metadata)
        .done();
    Res::new(
        "runtime",
        EXTENSION_STATUS,
        index.to_string(),
        "runtime.ExtensionStatusController",
        marshal(&yaml),
        spec.encode_to_vec(),
    )
}

/// 1.14's `ImageFactorySchematic`: the `schematic` extension's ID, and its author string
/// split into flavour and URL at the last ` (` (`parseAuthor`,
/// `controllers/runtime/image_factory_schematic.go`); absent without the extension.
fn image_factory_schematic(extensions: &[Extension]) -> Option<Res> {
    let found = extensions
        .iter()
        .find(|e| e.name == SCHEMATIC_EXTENSION && !e.version.is_empty())?;
    let (flavor, api_url) = match found.author.rfind(" (") {
        Some(at) => (
            found.author[..at].to_owned(),
            found.author[at + 2..].trim_end_matches(')').to_owned(),
        ),
        None => (found.author.clone(), String::new()),
    };
    let spec = ImageFactorySchematicSpec {
        schematic_id: found.version.clone(),
        flavor: flavor.clone(),
        apiurl: api_url.clone(),
    };
    let yaml = Fields::new()
        .field("schematicId", Yaml::str(&found.version))
        .field("flavor", Yaml::str(flavor))
        .field("apiUrl", Yaml::str(api_url))
        .done();
    Some(Res::new(
        "runtime",
        IMAGE_FACTORY_SCHEMATIC,
        "image-factory-schematic",
        "runtime.ImageFactorySchematicController",
        marshal(&yaml),
        spec.encode_to_vec(),
    ))
}

/// The node's extension resources.
pub(crate) fn resources(node: &Node, shared: &Shared, want: &Wanted) -> Vec<Res> {
    if !want.has(EXTENSION_STATUS) && !want.has(IMAGE_FACTORY_SCHEMATIC) {
        return Vec::new();
    }
    let extensions = installed(node);
    let mut out = Vec::new();
    if want.has(EXTENSION_STATUS) {
        out.extend(
            extensions
                .iter()
                .enumerate()
                .map(|(i, e)| extension_status(i, e)),
        );
    }
    if want.has(IMAGE_FACTORY_SCHEMATIC) && shared.is_1_14() {
        out.extend(image_factory_schematic(&extensions));
    }
    out
}
