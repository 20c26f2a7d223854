//! The Image Factory, as far as the simulator plays it: its schematic API (talos-facts §9.3),
//! the schematics it knows, and what a node's containerd finds when it pulls one of its
//! installer images (§9.4).
//!
//! - `POST /schematics` takes a schematic as YAML or JSON (the Content-Type is ignored),
//!   refuses an unknown field with the factory's 400, stores it, and answers **201** with
//!   `{"id", "schematic"}`, also when it already exists.
//! - `GET /schematics/{id}` answers the canonical YAML, or 404 `schematic not found`.
//! - The empty schematic, the factory's default, is always known (§9.4).
//! - `GET /image/{schematic}/{version}/{file}` serves an ISO, `<platform>-<arch>.iso` (§9.11):
//!   an unknown schematic is the factory's 404 `schematic not found`, a path it cannot read a
//!   400. The body is a few bytes standing for the ISO, enough for a BMC that downloads the
//!   media it is given (sushy-tools does); other boot assets are not served (404, saying so).
//!   A simulated BMC reads an ISO URL with [`SimFactory::iso`] instead of downloading it.
//!
//! What it does not model: the parts of a schematic Ichor does not declare (`owner`,
//! `overlay`, `embeddedMachineConfiguration`, `secureboot`, `diskImage`) are refused with a
//! 400 that says so, never stored silently; a schematic whose ID cannot be computed exactly
//! (`ichor_render::schematic::id` refuses it) is refused with that reason. Images, versions
//! and extension lists (`/versions`, `/version/{v}/extensions/official`) are not served, nor
//! boot assets other than ISOs.
//!
//! The factory's registry is every host at once: any image [`FactoryImage::parse`] reads is
//! one of its installers, whatever registry it names, and a node pulling it finds it only
//! when the factory knows its schematic ([`SimFactory::pull_error`]). The nodes of one
//! process share one factory ([`crate::NodeSpec::factory`]).

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use ichor_api::schematic::{Bootloader, MetaValue, Schematic};
use ichor_render::schematic::{self, EMPTY_ID, FactoryImage};
use serde::Deserialize;
use tokio::task::JoinHandle;

use crate::SimError;

/// A simulated Image Factory: the schematics it knows, and, when started, its HTTP API. A
/// clone is another handle to the same factory; the server stops when the last handle goes.
#[derive(Debug, Clone)]
pub struct SimFactory {
    store: Arc<Store>,
    server: Option<Arc<Server>>,
}

/// What the factory knows, shared by its handles and its server.
#[derive(Debug)]
struct Store {
    /// Its URL: the `Image Factory (<url>)` author of the schematic extension (§9.5).
    url: String,
    /// The schematics by ID, with their canonical YAML.
    schematics: Mutex<BTreeMap<String, Known>>,
    /// `POST /schematics` requests received, answered or refused.
    posts: AtomicUsize,
}

/// A schematic the factory knows, and its canonical YAML (the bytes its ID hashes).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Known {
    pub(crate) schematic: Schematic,
    pub(crate) yaml: String,
}

/// The running HTTP server, stopped with its last handle.
#[derive(Debug)]
struct Server {
    addr: SocketAddr,
    task: JoinHandle<()>,
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Default for SimFactory {
    /// A factory no HTTP server serves, named after the public one
    /// (`ichor_api::schematic::DEFAULT_FACTORY`): the nodes of a test that starts none.
    fn default() -> Self {
        Self::offline(ichor_api::schematic::DEFAULT_FACTORY)
    }
}

impl SimFactory {
    /// A factory with URL `url` that no HTTP server serves: schematics reach it through
    /// [`SimFactory::register`] only.
    pub fn offline(url: &str) -> Self {
        let empty = Known {
            schematic: Schematic::default(),
            yaml: "customization: {}\n".to_owned(),
        };
        let schematics = BTreeMap::from([(EMPTY_ID.to_owned(), empty)]);
        Self {
            store: Arc::new(Store {
                url: url.trim_end_matches('/').to_owned(),
                schematics: Mutex::new(schematics),
                posts: AtomicUsize::new(0),
            }),
            server: None,
        }
    }

    /// Starts the factory's HTTP API on `addr` (port 0 picks one); its URL is
    /// `http://<addr>`, and its registry host `<addr>`.
    pub async fn start(addr: SocketAddr) -> Result<Self, SimError> {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|source| SimError::Serve { addr, source })?;
        let bound = listener
            .local_addr()
            .map_err(|source| SimError::Serve { addr, source })?;
        let mut factory = Self::offline(&format!("http://{bound}"));
        let app = axum::Router::new()
            .route("/schematics", post(create))
            .route("/schematics/{id}", get(read))
            .route("/image/{schematic}/{version}/{file}", get(image))
            .with_state(Arc::clone(&factory.store));
        let task = tokio::spawn(async move {
            if let Err(error) = axum::serve(listener, app).await {
                tracing::warn!(%error, "the simulated Image Factory stopped serving");
            }
        });
        factory.server = Some(Arc::new(Server { addr: bound, task }));
        Ok(factory)
    }

    /// The factory's URL, e.g. `http://127.0.0.1:41234` (what `spec.imageFactory.url` names).
    pub fn url(&self) -> String {
        self.store.url.clone()
    }

    /// The address its HTTP API serves on, if started.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.server.as_ref().map(|s| s.addr)
    }

    /// How many `POST /schematics` requests it received, answered or refused.
    pub fn posts(&self) -> usize {
        self.store.posts.load(Ordering::SeqCst)
    }

    /// The IDs of the schematics it knows, sorted (the empty schematic's among them).
    pub fn ids(&self) -> Vec<String> {
        self.store.lock().keys().cloned().collect()
    }

    /// The canonical YAML of a known schematic.
    pub fn schematic(&self, id: &str) -> Option<String> {
        self.store.lock().get(id).map(|k| k.yaml.clone())
    }

    /// A known schematic, with its canonical YAML.
    pub(crate) fn known(&self, id: &str) -> Option<Known> {
        self.store.lock().get(id).cloned()
    }

    /// Stores `schematic` as a `POST /schematics` would (not counted); returns its ID.
    pub fn register(&self, schematic: &Schematic) -> Result<String, schematic::SchematicError> {
        self.store.put(schematic)
    }

    /// The ISO at `url`, as a BMC given it as virtual media finds it: `url` must be
    /// `<this factory's URL>/image/<schematic>/<version>/<platform>-<arch>.iso` (talos-facts
    /// §9.11) with a schematic the factory knows; otherwise what downloading it would meet.
    pub(crate) fn iso(&self, url: &str) -> Result<FactoryIso, IsoRefusal> {
        let path = strip_prefix_ignoring_case(url, &self.store.url)
            .and_then(|rest| rest.strip_prefix("/image/"))
            .ok_or(IsoRefusal::Unreachable)?;
        let path = path.split(['?', '#']).next().unwrap_or_default();
        let mut parts = path.splitn(3, '/');
        let (Some(schematic), Some(version), Some(file)) =
            (parts.next(), parts.next(), parts.next())
        else {
            return Err(IsoRefusal::NotFound("404 page not found".into()));
        };
        if !self.store.lock().contains_key(schematic) {
            return Err(IsoRefusal::NotFound("schematic not found".into()));
        }
        let (version, file) = read_image_path(version, file).map_err(|(status, message)| {
            if status == StatusCode::NOT_FOUND {
                IsoRefusal::NotFound(message)
            } else {
                IsoRefusal::Invalid(message)
            }
        })?;
        Ok(FactoryIso {
            schematic: schematic.to_owned(),
            version,
            file,
        })
    }

    /// Why a node's containerd fails to pull `image`, if it does: an installer of this
    /// factory's whose schematic it does not know. The factory answers the manifest request
    /// with a plain-text 404 (talos-facts §9.4), which containerd's resolver reads as
    /// `<ref>: not found` and its pull wraps as `failed to resolve reference "<ref>": …`
    /// (`errdefs.ErrNotFound`, §9.10). Any other image pulls as before.
    pub(crate) fn pull_error(&self, image: &str) -> Option<String> {
        let parsed = FactoryImage::parse(image)?;
        if self.store.lock().contains_key(parsed.schematic) {
            return None;
        }
        Some(format!(
            "failed to pull image {image:?}: failed to resolve reference {image:?}: {image}: not found"
        ))
    }
}

impl Store {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Known>> {
        self.schematics
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn put(&self, schematic: &Schematic) -> Result<String, schematic::SchematicError> {
        let yaml = schematic::canonical_yaml(schematic)?;
        let id = schematic::id(schematic)?;
        self.lock().insert(
            id.clone(),
            Known {
                schematic: schematic.clone(),
                yaml,
            },
        );
        Ok(id)
    }
}

/// An ISO of the factory's, read from its URL.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct FactoryIso {
    /// The schematic ID.
    pub(crate) schematic: String,
    /// The Talos version, with its `v` (the factory adds one when the URL has none).
    pub(crate) version: String,
    /// The file, e.g. `metal-amd64.iso`.
    pub(crate) file: String,
}

impl FactoryIso {
    /// The factory's metal installer of the same schematic and version: what a node booted
    /// from this ISO reports its extensions from (talos-facts §9.5).
    pub(crate) fn installer(&self) -> String {
        format!(
            "factory/metal-installer/{}:{}",
            self.schematic, self.version
        )
    }
}

/// Why an ISO URL cannot be downloaded from the factory.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum IsoRefusal {
    /// The URL is not under the factory's: nothing the simulator can reach serves it.
    Unreachable,
    /// The factory answers 404 with this message.
    NotFound(String),
    /// The factory answers 400 or 500 with this message (a path or version it cannot read).
    Invalid(String),
}

/// `url` without the prefix `base`, scheme and host compared without case.
fn strip_prefix_ignoring_case<'a>(url: &'a str, base: &str) -> Option<&'a str> {
    let head = url.get(..base.len())?;
    head.eq_ignore_ascii_case(base).then(|| &url[base.len()..])
}

/// Reads `<version>` and `<file>` of an image path as the factory does (image-factory
/// `internal/frontend/http/image.go` `handleImage`, `internal/profile/profile.go`
/// `ParseFromPath`): a `v` is added to a version without one, which must be semver; an ISO is
/// `<platform>-<arch>[-secureboot].iso` with `amd64` or `arm64`. Returns the version and the
/// file, or the status and message of the factory's refusal (404 for assets the simulator
/// does not serve).
fn read_image_path(version: &str, file: &str) -> Result<(String, String), (StatusCode, String)> {
    let version = if version.starts_with('v') {
        version.to_owned()
    } else {
        format!("v{version}")
    };
    if !is_semver(&version[1..]) {
        return Err((
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("error parsing version: {:?} is not semver", &version[1..]),
        ));
    }
    let Some(stem) = file.strip_suffix(".iso") else {
        return Err((
            StatusCode::NOT_FOUND,
            format!("{file} is not served by the simulated Image Factory (ISOs only)"),
        ));
    };
    if stem.ends_with("-secureboot") {
        return Err((
            StatusCode::BAD_REQUEST,
            "Secure Boot ISOs are not modelled by the simulated Image Factory".into(),
        ));
    }
    let Some((_platform, arch)) = stem.split_once('-') else {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("error parsing profile from path: invalid platform-arch: {stem:?}"),
        ));
    };
    if arch != "amd64" && arch != "arm64" {
        return Err((
            StatusCode::BAD_REQUEST,
            format!("error parsing profile from path: invalid architecture: {arch:?}"),
        ));
    }
    Ok((version, file.to_owned()))
}

/// Whether `text` is `MAJOR.MINOR.PATCH` with an optional `-pre` and `+build`.
fn is_semver(text: &str) -> bool {
    let core = text.split(['-', '+']).next().unwrap_or_default();
    let numbers: Vec<&str> = core.split('.').collect();
    numbers.len() == 3
        && numbers
            .iter()
            .all(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
}

/// A plain-text error as Go's `http.Error` writes it: the message and a newline.
fn plain(status: StatusCode, message: &str) -> Response {
    (
        status,
        [
            (header::CONTENT_TYPE, "text/plain; charset=utf-8"),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
        ],
        format!("{message}\n"),
    )
        .into_response()
}

/// `POST /schematics` (image-factory `internal/frontend/http/configuration.go`
/// `handleSchematicCreate`): 201 and `{"id","schematic"}` plus a newline (Go's JSON
/// encoder), also for a schematic already stored.
async fn create(State(store): State<Arc<Store>>, body: Bytes) -> Response {
    store.posts.fetch_add(1, Ordering::SeqCst);
    let schematic = match parse(&body) {
        Ok(schematic) => schematic,
        Err(message) => return plain(StatusCode::BAD_REQUEST, &message),
    };
    let id = match store.put(&schematic) {
        Ok(id) => id,
        Err(refused) => return plain(StatusCode::BAD_REQUEST, &refused.to_string()),
    };
    let yaml = store
        .lock()
        .get(&id)
        .map(|k| k.yaml.clone())
        .unwrap_or_default();
    #[derive(serde::Serialize)]
    struct Created<'a> {
        id: &'a str,
        schematic: &'a str,
    }
    let json = serde_json::to_string(&Created {
        id: &id,
        schematic: &yaml,
    })
    .unwrap_or_default();
    (
        StatusCode::CREATED,
        [(header::CONTENT_TYPE, "application/json")],
        format!("{json}\n"),
    )
        .into_response()
}

/// `GET /schematics/{id}` (`handleSchematicGet`): the canonical YAML, or 404
/// `schematic not found`.
async fn read(State(store): State<Arc<Store>>, Path(id): Path<String>) -> Response {
    match store.lock().get(&id).map(|k| k.yaml.clone()) {
        Some(yaml) => (
            StatusCode::OK,
            [(header::CONTENT_TYPE, "application/yaml")],
            yaml,
        )
            .into_response(),
        None => plain(StatusCode::NOT_FOUND, "schematic not found"),
    }
}

/// `GET /image/{schematic}/{version}/{file}` (`handleImage`): a few bytes standing for the ISO
/// (`Content-Disposition` naming the file, as the factory sends it), or the factory's refusal.
async fn image(
    State(store): State<Arc<Store>>,
    Path((schematic, version, file)): Path<(String, String, String)>,
) -> Response {
    if !store.lock().contains_key(&schematic) {
        return plain(StatusCode::NOT_FOUND, "schematic not found");
    }
    match read_image_path(&version, &file) {
        Ok((version, file)) => (
            StatusCode::OK,
            [
                (
                    header::CONTENT_TYPE,
                    "application/x-iso9660-image".to_owned(),
                ),
                (
                    header::CONTENT_DISPOSITION,
                    format!("attachment; filename=\"{file}\""),
                ),
            ],
            format!("ichor-sim ISO: Talos {version}, schematic {schematic}\n"),
        )
            .into_response(),
        Err((status, message)) => plain(status, &message),
    }
}

/// The factory's schematic model (image-factory `pkg/schematic/schematic.go`, talos-facts
/// §9.1), every field of it, so that an unknown field is told apart from one the simulator
/// does not model.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct Wire {
    #[serde(default)]
    owner: Option<String>,
    #[serde(default)]
    overlay: Option<WireOverlay>,
    #[serde(default)]
    customization: Option<WireCustomization>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireOverlay {
    #[serde(default)]
    image: Option<String>,
    #[serde(default)]
    name: Option<String>,
    #[serde(default)]
    options: Option<serde_json::Value>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireCustomization {
    #[serde(default)]
    embedded_machine_configuration: Option<String>,
    #[serde(default)]
    extra_kernel_args: Option<Vec<String>>,
    #[serde(default)]
    meta: Option<Vec<WireMeta>>,
    #[serde(default)]
    system_extensions: Option<WireExtensions>,
    #[serde(default)]
    bootloader: Option<String>,
    #[serde(default)]
    secureboot: Option<WireSecureBoot>,
    #[serde(default)]
    disk_image: Option<WireDiskImage>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct WireMeta {
    #[serde(default)]
    key: u8,
    #[serde(default)]
    value: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireExtensions {
    #[serde(default)]
    official_extensions: Option<Vec<String>>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireSecureBoot {
    #[serde(default)]
    enroll_keys: Option<String>,
    #[serde(default)]
    include_well_known_certificates: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields, rename_all = "camelCase")]
struct WireDiskImage {
    #[serde(default)]
    sector_size: Option<u64>,
}

/// The Go type of the struct whose fields serde expected, for the factory's message.
fn go_type(expected: &[&str]) -> &'static str {
    let has = |field: &str| expected.contains(&field);
    if has("customization") {
        "schematic.Schematic"
    } else if has("embeddedMachineConfiguration") {
        "schematic.Customization"
    } else if has("officialExtensions") {
        "schematic.SystemExtensions"
    } else if has("key") {
        "schematic.MetaValue"
    } else if has("options") {
        "schematic.Overlay"
    } else if has("enrollKeys") {
        "schematic.SecureBootCustomization"
    } else {
        "schematic.DiskImageCustomization"
    }
}

/// Reads a POSTed schematic as the factory does (`schematic.Unmarshal`: go-yaml with
/// `KnownFields(true)`, JSON being YAML), then keeps to what Ichor's [`Schematic`] carries.
/// An unknown field is refused with go-yaml's message, e.g. `yaml: construct errors: line 1:
/// field something not found in type schematic.Schematic` (the factory's integration test);
/// other YAML errors carry this parser's message, not go-yaml's.
fn parse(body: &[u8]) -> Result<Schematic, String> {
    let text = std::str::from_utf8(body).map_err(|e| format!("yaml: invalid UTF-8: {e}"))?;
    let wire: Wire = if text.trim().is_empty() {
        // go-yaml's decoder reads no document from an empty body: io.EOF.
        return Err("EOF".into());
    } else {
        serde_saphyr::from_str(text).map_err(|error| {
            let mut inner = &error;
            while let serde_saphyr::Error::WithSnippet { error, .. }
            | serde_saphyr::Error::AliasError { error, .. } = inner
            {
                inner = error;
            }
            match inner {
                serde_saphyr::Error::SerdeUnknownField {
                    field,
                    expected,
                    location,
                } => format!(
                    "yaml: construct errors: line {}: field {field} not found in type {}",
                    location.line(),
                    go_type(expected)
                ),
                other => format!("yaml: {other}"),
            }
        })?
    };
    let unmodelled = |field: &str| {
        Err(format!(
            "{field} is not modelled by the simulated Image Factory (ichor-sim models extraKernelArgs, meta, systemExtensions.officialExtensions and bootloader)"
        ))
    };
    if wire.owner.as_deref().is_some_and(|o| !o.is_empty()) {
        return unmodelled("owner");
    }
    if let Some(overlay) = &wire.overlay
        && (overlay.image.as_deref().is_some_and(|s| !s.is_empty())
            || overlay.name.as_deref().is_some_and(|s| !s.is_empty())
            || overlay.options.is_some())
    {
        return unmodelled("overlay");
    }
    let customization = wire.customization.unwrap_or_default();
    if customization
        .embedded_machine_configuration
        .as_deref()
        .is_some_and(|s| !s.is_empty())
    {
        return unmodelled("customization.embeddedMachineConfiguration");
    }
    if let Some(secureboot) = &customization.secureboot
        && (secureboot
            .enroll_keys
            .as_deref()
            .is_some_and(|s| !s.is_empty())
            || secureboot.include_well_known_certificates == Some(true))
    {
        return unmodelled("customization.secureboot");
    }
    if customization
        .disk_image
        .as_ref()
        .is_some_and(|d| d.sector_size.is_some_and(|s| s != 0))
    {
        return unmodelled("customization.diskImage");
    }
    // `none` is the enum's zero value: omitted when marshalled (talos-facts §9.1).
    let bootloader = match customization.bootloader.as_deref() {
        None | Some("" | "none") => None,
        Some("sd-boot") => Some(Bootloader::SdBoot),
        Some("grub") => Some(Bootloader::Grub),
        Some("dual-boot") => Some(Bootloader::DualBoot),
        Some(other) => {
            return Err(format!(
                "bootloader {other:?} is not one the simulated Image Factory knows (none, sd-boot, grub, dual-boot)"
            ));
        }
    };
    Ok(Schematic {
        system_extensions: customization
            .system_extensions
            .and_then(|e| e.official_extensions)
            .unwrap_or_default(),
        extra_kernel_args: customization.extra_kernel_args.unwrap_or_default(),
        meta: customization
            .meta
            .unwrap_or_default()
            .into_iter()
            .map(|m| MetaValue {
                key: m.key,
                value: m.value,
            })
            .collect(),
        bootloader,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_unknown_field_is_refused_with_go_yamls_message_naming_the_go_type() {
        assert_eq!(
            parse(b"something:").unwrap_err(),
            "yaml: construct errors: line 1: field something not found in type schematic.Schematic"
        );
        assert_eq!(
            parse(b"customization:\n    extraKernelArgs: [a]\n    systemExtension: {}\n")
                .unwrap_err(),
            "yaml: construct errors: line 3: field systemExtension not found in type schematic.Customization"
        );
        assert_eq!(
            parse(br#"{"customization":{"systemExtensions":{"official":[]}}}"#).unwrap_err(),
            "yaml: construct errors: line 1: field official not found in type schematic.SystemExtensions"
        );
    }

    #[test]
    fn yaml_and_json_read_alike_and_keep_their_order() {
        let yaml = parse(
            b"customization:\n  extraKernelArgs:\n    - net.ifnames=0\n  systemExtensions:\n    officialExtensions:\n      - siderolabs/gvisor\n      - siderolabs/intel-ucode\n",
        )
        .unwrap();
        let json = parse(
            br#"{"customization":{"extraKernelArgs":["net.ifnames=0"],"systemExtensions":{"officialExtensions":["siderolabs/gvisor","siderolabs/intel-ucode"]}}}"#,
        )
        .unwrap();
        assert_eq!(yaml, json);
        assert_eq!(
            schematic::id(&yaml).unwrap(),
            "b8e8fbbe1b520989e6c52c8dc8303070cb42095997e76e812fa8892393e1d176"
        );
    }

    #[test]
    fn meta_keys_read_in_hex_and_bootloader_none_is_the_default() {
        let read = parse(
            b"customization:\n  meta:\n    - key: 0xa\n      value: foo\n  bootloader: none\n",
        )
        .unwrap();
        assert_eq!(read.meta[0].key, 10);
        assert_eq!(read.bootloader, None);
        assert_eq!(
            schematic::id(&read).unwrap(),
            "d308a2a5ee2277bed5fbaa104fcbc8d59122abfa737df987a95b4ca763459a7f"
        );
    }

    #[test]
    fn fields_ichor_does_not_declare_are_refused_saying_so() {
        for (body, field) in [
            ("owner: me\n", "owner"),
            (
                "overlay:\n  image: siderolabs/sbc-raspberrypi\n  name: rpi_generic\n",
                "overlay",
            ),
            (
                "customization:\n  embeddedMachineConfiguration: x\n",
                "customization.embeddedMachineConfiguration",
            ),
            (
                "customization:\n  secureboot:\n    includeWellKnownCertificates: true\n",
                "customization.secureboot",
            ),
            (
                "customization:\n  diskImage:\n    sectorSize: 4096\n",
                "customization.diskImage",
            ),
        ] {
            let refused = parse(body.as_bytes()).unwrap_err();
            assert!(
                refused.starts_with(&format!("{field} is not modelled")),
                "{body}: {refused}"
            );
        }
    }

    #[test]
    fn an_iso_url_is_read_as_the_factory_reads_it() {
        let factory = SimFactory::offline("https://factory.example");
        let base = "https://Factory.example/image";
        let iso = factory
            .iso(&format!("{base}/{EMPTY_ID}/1.14.1/metal-amd64.iso"))
            .unwrap();
        assert_eq!(
            iso,
            FactoryIso {
                schematic: EMPTY_ID.into(),
                version: "v1.14.1".into(),
                file: "metal-amd64.iso".into(),
            }
        );
        let unknown = "0".repeat(64);
        assert_eq!(
            factory.iso(&format!("{base}/{unknown}/v1.14.1/metal-amd64.iso")),
            Err(IsoRefusal::NotFound("schematic not found".into()))
        );
        assert!(matches!(
            factory.iso(&format!("{base}/{EMPTY_ID}/v1.14.1/metal-riscv64.iso")),
            Err(IsoRefusal::Invalid(_))
        ));
        assert!(matches!(
            factory.iso(&format!("{base}/{EMPTY_ID}/v1.14.1/metal-amd64.raw.xz")),
            Err(IsoRefusal::NotFound(_))
        ));
        assert!(matches!(
            factory.iso(&format!("{base}/{EMPTY_ID}/latest/metal-amd64.iso")),
            Err(IsoRefusal::Invalid(_))
        ));
        assert_eq!(
            factory.iso("https://elsewhere.example/image/x/v1.14.1/metal-amd64.iso"),
            Err(IsoRefusal::Unreachable)
        );
    }

    #[test]
    fn only_installers_of_unknown_schematics_fail_to_pull() {
        let factory = SimFactory::default();
        let gvisor = Schematic {
            system_extensions: vec!["siderolabs/gvisor".into()],
            ..Schematic::default()
        };
        let id = schematic::id(&gvisor).unwrap();
        let image = format!("factory.talos.dev/metal-installer/{id}:v1.14.1");
        assert_eq!(
            factory.pull_error(&image).unwrap(),
            format!(
                "failed to pull image \"{image}\": failed to resolve reference \"{image}\": {image}: not found"
            )
        );
        assert_eq!(factory.register(&gvisor).unwrap(), id);
        assert_eq!(factory.pull_error(&image), None);
        let empty = format!("127.0.0.1:1/installer/{EMPTY_ID}:v1.13.9");
        assert_eq!(factory.pull_error(&empty), None);
        assert_eq!(
            factory.pull_error("ghcr.io/siderolabs/installer:v1.13.9"),
            None
        );
    }
}
