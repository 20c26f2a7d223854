//! The Redfish resources this client reads, as they arrive (`*Doc`, private, each field
//! optional where the schema lets a service leave it out or null) and as callers see them
//! ([`System`], [`VirtualMedia`]); and the values it sends ([`ResetType`], [`BootTarget`],
//! [`BootEnabled`]). Reading them is pure: [`Doc`]'s parse names the field that did not read.

use serde::Deserialize;
use serde::de::DeserializeOwned;

/// A link to another resource (`{"@odata.id": "/redfish/v1/…"}`).
#[derive(Debug, Deserialize)]
pub(crate) struct Link {
    #[serde(rename = "@odata.id")]
    pub(crate) odata_id: String,
}

/// The service root (`/redfish/v1/`): only its link to the systems.
#[derive(Debug, Deserialize)]
pub(crate) struct ServiceRootDoc {
    #[serde(rename = "Systems")]
    pub(crate) systems: Option<Link>,
}

/// A resource collection: its members, and the next page when the service pages them.
#[derive(Debug, Deserialize)]
pub(crate) struct CollectionDoc {
    #[serde(rename = "Members", default)]
    pub(crate) members: Option<Vec<Link>>,
    #[serde(rename = "Members@odata.nextLink")]
    pub(crate) next_link: Option<String>,
}

/// `Status`: the resource's state and health.
#[derive(Debug, Default, Deserialize)]
struct StatusDoc {
    #[serde(rename = "State")]
    state: Option<String>,
    #[serde(rename = "Health")]
    health: Option<String>,
}

/// `ComputerSystem.Boot`: the boot source override.
#[derive(Debug, Default, Deserialize)]
struct BootDoc {
    #[serde(rename = "BootSourceOverrideTarget")]
    target: Option<String>,
    #[serde(rename = "BootSourceOverrideEnabled")]
    enabled: Option<String>,
    #[serde(rename = "BootSourceOverrideTarget@Redfish.AllowableValues")]
    allowed_targets: Option<Vec<String>>,
}

/// An action: where to post it, what its parameter may be, and where its `ActionInfo` is.
#[derive(Debug, Deserialize)]
struct ActionDoc {
    target: Option<String>,
    #[serde(rename = "ResetType@Redfish.AllowableValues")]
    allowed_reset_types: Option<Vec<String>>,
    #[serde(rename = "@Redfish.ActionInfo")]
    action_info: Option<String>,
}

#[derive(Debug, Default, Deserialize)]
struct SystemActionsDoc {
    #[serde(rename = "#ComputerSystem.Reset")]
    reset: Option<ActionDoc>,
}

#[derive(Debug, Default, Deserialize)]
struct SystemLinksDoc {
    #[serde(rename = "ManagedBy")]
    managed_by: Option<Vec<Link>>,
}

/// `ComputerSystem`, the fields this client reads.
#[derive(Debug, Deserialize)]
struct SystemDoc {
    #[serde(rename = "@odata.id")]
    odata_id: Option<String>,
    #[serde(rename = "@odata.etag")]
    odata_etag: Option<String>,
    #[serde(rename = "Id")]
    id: Option<String>,
    #[serde(rename = "UUID")]
    uuid: Option<String>,
    #[serde(rename = "PowerState")]
    power_state: Option<String>,
    #[serde(rename = "Status")]
    status: Option<StatusDoc>,
    #[serde(rename = "Boot")]
    boot: Option<BootDoc>,
    #[serde(rename = "Actions")]
    actions: Option<SystemActionsDoc>,
    #[serde(rename = "Links")]
    links: Option<SystemLinksDoc>,
    #[serde(rename = "VirtualMedia")]
    virtual_media: Option<Link>,
}

/// `Manager`: only its virtual media collection.
#[derive(Debug, Deserialize)]
pub(crate) struct ManagerDoc {
    #[serde(rename = "VirtualMedia")]
    pub(crate) virtual_media: Option<Link>,
}

#[derive(Debug, Default, Deserialize)]
struct MediaActionsDoc {
    #[serde(rename = "#VirtualMedia.InsertMedia")]
    insert: Option<ActionDoc>,
    #[serde(rename = "#VirtualMedia.EjectMedia")]
    eject: Option<ActionDoc>,
}

/// `VirtualMedia`, the fields this client reads.
#[derive(Debug, Deserialize)]
struct VirtualMediaDoc {
    #[serde(rename = "@odata.id")]
    odata_id: Option<String>,
    #[serde(rename = "Id")]
    id: Option<String>,
    #[serde(rename = "MediaTypes")]
    media_types: Option<Vec<String>>,
    #[serde(rename = "Image")]
    image: Option<String>,
    #[serde(rename = "Inserted")]
    inserted: Option<bool>,
    #[serde(rename = "WriteProtected")]
    write_protected: Option<bool>,
    #[serde(rename = "Actions")]
    actions: Option<MediaActionsDoc>,
}

/// One parameter of an `ActionInfo` resource.
#[derive(Debug, Deserialize)]
struct ParameterDoc {
    #[serde(rename = "Name")]
    name: Option<String>,
    #[serde(rename = "AllowableValues")]
    allowable_values: Option<Vec<String>>,
}

/// `ActionInfo`: the parameters an action takes.
#[derive(Debug, Deserialize)]
pub(crate) struct ActionInfoDoc {
    #[serde(rename = "Parameters")]
    parameters: Option<Vec<ParameterDoc>>,
}

impl ActionInfoDoc {
    /// The values the parameter `name` allows, when the service lists them.
    pub(crate) fn allowed(self, name: &str) -> Option<Vec<String>> {
        self.parameters?
            .into_iter()
            .find(|p| p.name.as_deref() == Some(name))?
            .allowable_values
    }
}

/// A JSON answer that did not read: where, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Unreadable(pub(crate) String);

/// Reads `body` as `T`, naming the field that did not read.
pub(crate) fn parse<T: DeserializeOwned>(body: &[u8]) -> Result<T, Unreadable> {
    let mut de = serde_json::Deserializer::from_slice(body);
    serde_path_to_error::deserialize(&mut de).map_err(|err| {
        let path = err.path().to_string();
        let at = if path == "." {
            String::new()
        } else {
            format!(" at {path}")
        };
        Unreadable(format!(
            "a body that is not the Redfish resource expected{at}: {}",
            err.inner()
        ))
    })
}

/// A system's power state (`ComputerSystem.PowerState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PowerState {
    /// Powered on.
    On,
    /// Powered off.
    Off,
    /// Powering on.
    PoweringOn,
    /// Powering off.
    PoweringOff,
    /// Paused.
    Paused,
    /// A value this client does not know, as the service wrote it.
    Other(String),
}

impl PowerState {
    fn from_redfish(value: String) -> Self {
        match value.as_str() {
            "On" => Self::On,
            "Off" => Self::Off,
            "PoweringOn" => Self::PoweringOn,
            "PoweringOff" => Self::PoweringOff,
            "Paused" => Self::Paused,
            _ => Self::Other(value),
        }
    }
}

/// A resource's health (`Status.Health`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Health {
    /// Normal.
    Ok,
    /// A condition requires attention.
    Warning,
    /// A critical condition requires immediate attention.
    Critical,
    /// A value this client does not know, as the service wrote it.
    Other(String),
}

impl Health {
    fn from_redfish(value: String) -> Self {
        match value.as_str() {
            "OK" => Self::Ok,
            "Warning" => Self::Warning,
            "Critical" => Self::Critical,
            _ => Self::Other(value),
        }
    }
}

/// A system's boot source override, as read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Boot {
    /// `BootSourceOverrideTarget` (`Cd`, `Hdd`, `Pxe`, `None` …).
    pub target: Option<String>,
    /// `BootSourceOverrideEnabled` (`Disabled`, `Once`, `Continuous`).
    pub enabled: Option<String>,
    /// The targets the service accepts, when it lists them.
    pub allowed_targets: Option<Vec<String>>,
}

/// A system's `#ComputerSystem.Reset` action.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResetAction {
    /// Where the action is posted.
    pub target: String,
    /// The reset types listed inline (`ResetType@Redfish.AllowableValues`).
    pub allowed: Option<Vec<String>>,
    /// The action's `ActionInfo` resource, which may list them instead.
    pub action_info: Option<String>,
}

/// A computer system (`ComputerSystem`), the fields this client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct System {
    /// Its `@odata.id`.
    pub odata_id: String,
    /// Its `Id`.
    pub id: Option<String>,
    /// Its `UUID`, as the service wrote it (see [`smbios_uuid_matches`](crate::smbios_uuid_matches)).
    pub uuid: Option<String>,
    /// Its `PowerState`.
    pub power_state: Option<PowerState>,
    /// Its `Status.Health`.
    pub health: Option<Health>,
    /// Its `Status.State` (`Enabled`, `Absent`, …).
    pub state: Option<String>,
    /// Its boot source override.
    pub boot: Boot,
    /// Its reset action, when it has one.
    pub reset: Option<ResetAction>,
    /// The managers it names in `Links.ManagedBy`.
    pub managed_by: Vec<String>,
    /// Its own virtual media collection, when it has one.
    pub virtual_media: Option<String>,
    /// The version to send as `If-Match` with a change (the `ETag` header, else `@odata.etag`).
    pub etag: Option<String>,
}

impl System {
    /// Reads a system from its answer: `path` is where it was read, `etag` the answer's
    /// `ETag` header.
    pub(crate) fn read(body: &[u8], path: &str, etag: Option<String>) -> Result<Self, Unreadable> {
        let doc: SystemDoc = parse(body)?;
        let status = doc.status.unwrap_or_default();
        let boot = doc.boot.unwrap_or_default();
        let reset = doc.actions.unwrap_or_default().reset;
        let reset = match reset {
            None => None,
            Some(action) => Some(ResetAction {
                target: action.target.ok_or_else(|| {
                    Unreadable("no target for Actions.#ComputerSystem.Reset".to_owned())
                })?,
                allowed: action.allowed_reset_types,
                action_info: action.action_info,
            }),
        };
        Ok(Self {
            odata_id: doc.odata_id.unwrap_or_else(|| path.to_owned()),
            id: doc.id,
            uuid: doc.uuid,
            power_state: doc.power_state.map(PowerState::from_redfish),
            health: status.health.map(Health::from_redfish),
            state: status.state,
            boot: Boot {
                target: boot.target,
                enabled: boot.enabled,
                allowed_targets: boot.allowed_targets,
            },
            reset,
            managed_by: doc
                .links
                .unwrap_or_default()
                .managed_by
                .unwrap_or_default()
                .into_iter()
                .map(|link| link.odata_id)
                .collect(),
            virtual_media: doc.virtual_media.map(|link| link.odata_id),
            etag: etag.or(doc.odata_etag),
        })
    }
}

/// A virtual media device (`VirtualMedia`), the fields this client reads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VirtualMedia {
    /// Its `@odata.id`.
    pub odata_id: String,
    /// Its `Id`.
    pub id: Option<String>,
    /// The media it plays (`CD`, `DVD`, `Floppy`, `USBStick` …).
    pub media_types: Vec<String>,
    /// The URL of the image it holds (`Image`); empty or absent when none.
    pub image: Option<String>,
    /// Whether the image is inserted.
    pub inserted: Option<bool>,
    /// Whether the image is write-protected.
    pub write_protected: Option<bool>,
    /// Where `#VirtualMedia.InsertMedia` is posted, when offered.
    pub insert_target: Option<String>,
    /// Where `#VirtualMedia.EjectMedia` is posted, when offered.
    pub eject_target: Option<String>,
}

impl VirtualMedia {
    /// Reads a virtual media device from its answer, read at `path`.
    pub(crate) fn read(body: &[u8], path: &str) -> Result<Self, Unreadable> {
        let doc: VirtualMediaDoc = parse(body)?;
        let actions = doc.actions.unwrap_or_default();
        Ok(Self {
            odata_id: doc.odata_id.unwrap_or_else(|| path.to_owned()),
            id: doc.id,
            media_types: doc.media_types.unwrap_or_default(),
            image: doc.image.filter(|image| !image.is_empty()),
            inserted: doc.inserted,
            write_protected: doc.write_protected,
            insert_target: actions.insert.and_then(|a| a.target),
            eject_target: actions.eject.and_then(|a| a.target),
        })
    }

    /// Whether it plays CDs or DVDs: where a bootable ISO goes.
    #[must_use]
    pub fn is_optical(&self) -> bool {
        self.media_types
            .iter()
            .any(|t| t.eq_ignore_ascii_case("CD") || t.eq_ignore_ascii_case("DVD"))
    }
}

/// A `#ComputerSystem.Reset` type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ResetType {
    /// Turn on.
    On,
    /// Turn off at once.
    ForceOff,
    /// Shut down in order, then turn off.
    GracefulShutdown,
    /// Shut down in order, then restart.
    GracefulRestart,
    /// Restart at once.
    ForceRestart,
    /// Turn on at once.
    ForceOn,
    /// Press the power button.
    PushPowerButton,
    /// Turn off, then on.
    PowerCycle,
    /// Send a non-maskable interrupt.
    Nmi,
}

impl ResetType {
    /// Its Redfish name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::On => "On",
            Self::ForceOff => "ForceOff",
            Self::GracefulShutdown => "GracefulShutdown",
            Self::GracefulRestart => "GracefulRestart",
            Self::ForceRestart => "ForceRestart",
            Self::ForceOn => "ForceOn",
            Self::PushPowerButton => "PushPowerButton",
            Self::PowerCycle => "PowerCycle",
            Self::Nmi => "Nmi",
        }
    }
}

/// A `BootSourceOverrideTarget`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootTarget {
    /// No override: boot as configured.
    None,
    /// The CD or DVD drive (virtual media included).
    Cd,
    /// The hard disk.
    Hdd,
    /// The network (PXE).
    Pxe,
    /// A USB device.
    Usb,
    /// The firmware's setup.
    BiosSetup,
}

impl BootTarget {
    /// Its Redfish name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::None => "None",
            Self::Cd => "Cd",
            Self::Hdd => "Hdd",
            Self::Pxe => "Pxe",
            Self::Usb => "Usb",
            Self::BiosSetup => "BiosSetup",
        }
    }
}

/// A `BootSourceOverrideEnabled`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BootEnabled {
    /// No override.
    Disabled,
    /// On the next boot only.
    Once,
    /// On every boot until changed.
    Continuous,
}

impl BootEnabled {
    /// Its Redfish name.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Disabled => "Disabled",
            Self::Once => "Once",
            Self::Continuous => "Continuous",
        }
    }
}

/// Whether `value` may be sent, given the values a service lists (`None`: it lists none, so
/// anything may be tried); `Err` names the listed ones.
pub(crate) fn check_listed(value: &str, listed: Option<&[String]>) -> Result<(), String> {
    match listed {
        Some(listed) if !listed.iter().any(|v| v == value) => Err(if listed.is_empty() {
            "none".to_owned()
        } else {
            listed.join(", ")
        }),
        _ => Ok(()),
    }
}

/// The messages of a Redfish error answer: each `error.@Message.ExtendedInfo[].Message`, else
/// `error.message`, else a short text body; each on one line, at most [`MESSAGES`] of at most
/// [`MESSAGE_CHARS`] characters.
pub(crate) fn error_messages(body: &[u8]) -> Vec<String> {
    let messages: Vec<String> = match serde_json::from_slice::<serde_json::Value>(body) {
        Ok(value) => {
            let error = value.get("error");
            let extended: Vec<String> = error
                .and_then(|e| e.get("@Message.ExtendedInfo"))
                .and_then(serde_json::Value::as_array)
                .map(|infos| {
                    infos
                        .iter()
                        .filter_map(|info| info.get("Message")?.as_str())
                        .map(str::to_owned)
                        .collect()
                })
                .unwrap_or_default();
            if extended.is_empty() {
                error
                    .and_then(|e| e.get("message"))
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_owned)
                    .into_iter()
                    .collect()
            } else {
                extended
            }
        }
        Err(_) => std::str::from_utf8(body)
            .ok()
            .map(str::to_owned)
            .into_iter()
            .collect(),
    };
    messages
        .iter()
        .map(|m| one_line(m))
        .filter(|m| !m.is_empty())
        .take(MESSAGES)
        .collect()
}

/// The most messages of one answer kept.
const MESSAGES: usize = 8;
/// The most characters of one message kept.
const MESSAGE_CHARS: usize = 300;

/// `text` on one line (control characters as spaces, runs of spaces as one), cut at
/// [`MESSAGE_CHARS`] characters.
fn one_line(text: &str) -> String {
    let spaced: String = text
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    let words: Vec<&str> = spaced.split_whitespace().collect();
    let line = words.join(" ");
    if line.chars().count() > MESSAGE_CHARS {
        let cut: String = line.chars().take(MESSAGE_CHARS).collect();
        format!("{cut}…")
    } else {
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SYSTEM: &str = r##"{
        "@odata.id": "/redfish/v1/Systems/1",
        "@odata.etag": "W/\"1\"",
        "Id": "1",
        "UUID": "27946B59-9E44-4FA7-8E91-F3527A1EF094",
        "PowerState": "On",
        "Status": {"State": "Enabled", "Health": "OK"},
        "Boot": {
            "BootSourceOverrideEnabled": "Disabled",
            "BootSourceOverrideTarget": "None",
            "BootSourceOverrideTarget@Redfish.AllowableValues": ["None", "Pxe", "Cd", "Hdd"]
        },
        "Actions": {"#ComputerSystem.Reset": {
            "target": "/redfish/v1/Systems/1/Actions/ComputerSystem.Reset",
            "ResetType@Redfish.AllowableValues": ["On", "ForceOff"]
        }},
        "Links": {"ManagedBy": [{"@odata.id": "/redfish/v1/Managers/bmc"}]},
        "VirtualMedia": {"@odata.id": "/redfish/v1/Systems/1/VirtualMedia"}
    }"##;

    #[test]
    fn reads_a_system() {
        let system = System::read(SYSTEM.as_bytes(), "/x", None).expect("reads");
        assert_eq!(system.odata_id, "/redfish/v1/Systems/1");
        assert_eq!(system.power_state, Some(PowerState::On));
        assert_eq!(system.health, Some(Health::Ok));
        assert_eq!(system.state.as_deref(), Some("Enabled"));
        assert_eq!(system.boot.target.as_deref(), Some("None"));
        assert_eq!(
            system.boot.allowed_targets.as_deref().map(<[String]>::len),
            Some(4)
        );
        let reset = system.reset.expect("a reset action");
        assert_eq!(reset.allowed, Some(vec!["On".into(), "ForceOff".into()]));
        assert_eq!(system.managed_by, ["/redfish/v1/Managers/bmc"]);
        assert_eq!(system.etag.as_deref(), Some("W/\"1\""));
        let header = System::read(SYSTEM.as_bytes(), "/x", Some("\"7\"".into())).expect("reads");
        assert_eq!(header.etag.as_deref(), Some("\"7\""), "the header wins");
    }

    #[test]
    fn a_sparse_system_reads_with_nulls_and_gaps() {
        let system = System::read(
            br#"{"UUID": null, "PowerState": "Resetting", "Boot": null, "Status": {}}"#,
            "/redfish/v1/Systems/2",
            None,
        )
        .expect("reads");
        assert_eq!(system.odata_id, "/redfish/v1/Systems/2");
        assert_eq!(system.uuid, None);
        assert_eq!(
            system.power_state,
            Some(PowerState::Other("Resetting".into()))
        );
        assert_eq!(system.boot, Boot::default());
        assert_eq!(system.reset, None);
    }

    #[test]
    fn a_misshapen_answer_names_its_field() {
        let cases: [(&[u8], &str); 5] = [
            (br#"{"PowerState": 1}"#, "PowerState"),
            (
                br#"{"Boot": {"BootSourceOverrideTarget": ["Cd"]}}"#,
                "Boot.BootSourceOverrideTarget",
            ),
            (
                br#"{"Links": {"ManagedBy": [{"@odata.id": 3}]}}"#,
                "Links.ManagedBy[0].@odata.id",
            ),
            (
                br##"{"Actions": {"#ComputerSystem.Reset": {}}}"##,
                "#ComputerSystem.Reset",
            ),
            (b"[]", "Redfish resource"),
        ];
        for (body, field) in cases {
            let Unreadable(detail) = System::read(body, "/s", None).expect_err("misshapen");
            assert!(detail.contains(field), "{detail} should name {field}");
        }
    }

    #[test]
    fn nothing_the_bmc_sends_panics_the_reader() {
        let bodies: [&[u8]; 9] = [
            b"",
            b"\xff\xfe\x00",
            b"null",
            b"{\"UUID\": \"\\ud800\"}",
            b"{\"Boot\": {\"BootSourceOverrideTarget@Redfish.AllowableValues\": [null]}}",
            b"{\"MediaTypes\": \"CD\"}",
            b"{\"Inserted\": \"yes\"}",
            b"{\"Members\": [{}]}",
            b"{\"PowerState\": 1e999999}",
        ];
        for body in bodies {
            let _ = System::read(body, "/s", None);
            let _ = VirtualMedia::read(body, "/m");
            let _ = parse::<CollectionDoc>(body);
            let _ = error_messages(body);
        }
        let deep = "[".repeat(100_000);
        assert!(System::read(deep.as_bytes(), "/s", None).is_err());
        assert!(error_messages(deep.as_bytes()).len() <= 1);
    }

    #[test]
    fn reads_virtual_media_and_knows_a_cd() {
        let media = VirtualMedia::read(
            br##"{"@odata.id": "/m/Cd", "MediaTypes": ["CD", "DVD"], "Image": "",
                "Inserted": false, "Actions": {
                  "#VirtualMedia.InsertMedia": {"target": "/m/Cd/Actions/VirtualMedia.InsertMedia"},
                  "#VirtualMedia.EjectMedia": {"target": "/m/Cd/Actions/VirtualMedia.EjectMedia"}}}"##,
            "/m/Cd",
        )
        .expect("reads");
        assert!(media.is_optical());
        assert_eq!(media.image, None, "an empty Image is no image");
        assert_eq!(
            media.insert_target.as_deref(),
            Some("/m/Cd/Actions/VirtualMedia.InsertMedia")
        );
        let floppy = VirtualMedia::read(br#"{"MediaTypes": ["Floppy", "USBStick"]}"#, "/m/F")
            .expect("reads");
        assert!(!floppy.is_optical());
    }

    #[test]
    fn a_value_is_checked_only_against_a_list_the_bmc_gives() {
        let listed = vec!["On".to_owned(), "ForceOff".to_owned()];
        assert_eq!(check_listed("On", Some(&listed)), Ok(()));
        assert_eq!(
            check_listed("PowerCycle", Some(&listed)),
            Err("On, ForceOff".to_owned())
        );
        assert_eq!(check_listed("PowerCycle", None), Ok(()));
        assert_eq!(check_listed("On", Some(&[])), Err("none".to_owned()));
    }

    #[test]
    fn error_messages_come_from_extended_info_then_the_message_then_the_text() {
        let extended = br#"{"error": {"code": "Base.1.8.GeneralError", "message": "See ExtendedInfo",
            "@Message.ExtendedInfo": [
              {"MessageId": "Base.1.8.PropertyValueNotInList", "Message": "The value Sleep for ResetType is not in the list."},
              {"MessageId": "Base.1.8.Other"}]}}"#;
        assert_eq!(
            error_messages(extended),
            ["The value Sleep for ResetType is not in the list."]
        );
        let plain = br#"{"error": {"message": "Cannot download virtual media: got error 404",
            "@Message.ExtendedInfo": [{"MessageId": "Base.1.0.GeneralError"}]}}"#;
        assert_eq!(
            error_messages(plain),
            ["Cannot download virtual media: got error 404"]
        );
        assert_eq!(
            error_messages(b"PATCH only works for Boot\nand IndicatorLED\n"),
            ["PATCH only works for Boot and IndicatorLED"]
        );
        let long = format!("{{\"error\": {{\"message\": \"{}\"}}}}", "x".repeat(5000));
        let cut = error_messages(long.as_bytes());
        assert_eq!(cut[0].chars().count(), MESSAGE_CHARS + 1);
        assert!(error_messages(b"").is_empty());
    }

    #[test]
    fn an_action_info_lists_one_parameters_values() {
        let info: ActionInfoDoc = parse(
            br#"{"Parameters": [{"Name": "ResetType", "AllowableValues": ["On", "ForceOff"]}]}"#,
        )
        .expect("reads");
        assert_eq!(
            info.allowed("ResetType"),
            Some(vec!["On".to_owned(), "ForceOff".to_owned()])
        );
    }
}
