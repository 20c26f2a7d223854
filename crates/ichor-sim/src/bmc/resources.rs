//! The Redfish resources the BMC serves, as JSON: their URIs, their `@odata` identity, the
//! DMTF schema version each claims (`json-schema/` of DMTF's Redfish-Publications, 2025.4),
//! and the OData service document and `$metadata` over them.

use serde_json::{Value, json};

use super::firmware::{Enabled, Named as _, Settings, Target};
use super::sessions::{Account, Session};

/// The Redfish version of the specification (DSP0266) the service follows.
pub(crate) const REDFISH_VERSION: &str = "1.20.0";

/// The service root.
pub(crate) const ROOT: &str = "/redfish/v1/";
/// The systems.
pub(crate) const SYSTEMS: &str = "/redfish/v1/Systems";
/// The one system.
pub(crate) const SYSTEM: &str = "/redfish/v1/Systems/system";
/// Its reset action.
pub(crate) const RESET: &str = "/redfish/v1/Systems/system/Actions/ComputerSystem.Reset";
/// The managers.
pub(crate) const MANAGERS: &str = "/redfish/v1/Managers";
/// The one manager, the BMC.
pub(crate) const MANAGER: &str = "/redfish/v1/Managers/bmc";
/// Its virtual media.
pub(crate) const MEDIA: &str = "/redfish/v1/Managers/bmc/VirtualMedia";
/// The virtual CD.
pub(crate) const CD: &str = "/redfish/v1/Managers/bmc/VirtualMedia/Cd";
/// Its insert action.
pub(crate) const INSERT: &str =
    "/redfish/v1/Managers/bmc/VirtualMedia/Cd/Actions/VirtualMedia.InsertMedia";
/// Its eject action.
pub(crate) const EJECT: &str =
    "/redfish/v1/Managers/bmc/VirtualMedia/Cd/Actions/VirtualMedia.EjectMedia";
/// The session service.
pub(crate) const SESSION_SERVICE: &str = "/redfish/v1/SessionService";
/// The sessions.
pub(crate) const SESSIONS: &str = "/redfish/v1/SessionService/Sessions";
/// The account service.
pub(crate) const ACCOUNT_SERVICE: &str = "/redfish/v1/AccountService";
/// The accounts.
pub(crate) const ACCOUNTS: &str = "/redfish/v1/AccountService/Accounts";
/// The roles.
pub(crate) const ROLES: &str = "/redfish/v1/AccountService/Roles";

/// The `ResetType` values the system takes.
pub(crate) const RESET_TYPES: &[&str] = &[
    "On",
    "ForceOff",
    "GracefulShutdown",
    "ForceRestart",
    "GracefulRestart",
    "PowerCycle",
];

/// The predefined roles and their privileges (DSP0266's role table).
pub(crate) const ROLE_PRIVILEGES: &[(&str, &[&str])] = &[
    (
        "Administrator",
        &[
            "Login",
            "ConfigureManager",
            "ConfigureUsers",
            "ConfigureComponents",
            "ConfigureSelf",
        ],
    ),
    (
        "Operator",
        &["Login", "ConfigureComponents", "ConfigureSelf"],
    ),
    ("ReadOnly", &["Login", "ConfigureSelf"]),
];

/// A resource type: its namespace, the schema version served, and the CSDL file that defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Kind {
    namespace: &'static str,
    /// `v1_20_0`, or empty for an unversioned collection.
    version: &'static str,
}

impl Kind {
    const fn new(namespace: &'static str, version: &'static str) -> Self {
        Self { namespace, version }
    }

    /// Whether it is a versioned resource type (not a collection).
    pub(crate) fn versioned(self) -> bool {
        !self.version.is_empty()
    }

    /// `@odata.type`.
    pub(crate) fn odata_type(self) -> String {
        if self.version.is_empty() {
            format!("#{0}.{0}", self.namespace)
        } else {
            format!("#{0}.{1}.{0}", self.namespace, self.version)
        }
    }

    /// The JSON schema a `Link: rel=describedby` names.
    pub(crate) fn schema(self) -> String {
        if self.version.is_empty() {
            format!(
                "https://redfish.dmtf.org/schemas/v1/{}.json",
                self.namespace
            )
        } else {
            format!(
                "https://redfish.dmtf.org/schemas/v1/{}.{}.json",
                self.namespace, self.version
            )
        }
    }
}

/// The types served.
pub(crate) mod kinds {
    use super::Kind;
    /// `ServiceRoot`.
    pub(crate) const SERVICE_ROOT: Kind = Kind::new("ServiceRoot", "v1_20_0");
    /// `ComputerSystemCollection`.
    pub(crate) const SYSTEMS: Kind = Kind::new("ComputerSystemCollection", "");
    /// `ComputerSystem`.
    pub(crate) const SYSTEM: Kind = Kind::new("ComputerSystem", "v1_27_0");
    /// `ManagerCollection`.
    pub(crate) const MANAGERS: Kind = Kind::new("ManagerCollection", "");
    /// `Manager`.
    pub(crate) const MANAGER: Kind = Kind::new("Manager", "v1_24_0");
    /// `VirtualMediaCollection`.
    pub(crate) const MEDIA: Kind = Kind::new("VirtualMediaCollection", "");
    /// `VirtualMedia`.
    pub(crate) const CD: Kind = Kind::new("VirtualMedia", "v1_6_5");
    /// `SessionService`.
    pub(crate) const SESSION_SERVICE: Kind = Kind::new("SessionService", "v1_2_0");
    /// `SessionCollection`.
    pub(crate) const SESSIONS: Kind = Kind::new("SessionCollection", "");
    /// `Session`.
    pub(crate) const SESSION: Kind = Kind::new("Session", "v1_8_0");
    /// `AccountService`.
    pub(crate) const ACCOUNT_SERVICE: Kind = Kind::new("AccountService", "v1_18_1");
    /// `ManagerAccountCollection`.
    pub(crate) const ACCOUNTS: Kind = Kind::new("ManagerAccountCollection", "");
    /// `ManagerAccount`.
    pub(crate) const ACCOUNT: Kind = Kind::new("ManagerAccount", "v1_14_1");
    /// `RoleCollection`.
    pub(crate) const ROLES: Kind = Kind::new("RoleCollection", "");
    /// `Role`.
    pub(crate) const ROLE: Kind = Kind::new("Role", "v1_3_3");

    /// Every type, for `$metadata`.
    pub(crate) const ALL: &[Kind] = &[
        SERVICE_ROOT,
        SYSTEMS,
        SYSTEM,
        MANAGERS,
        MANAGER,
        MEDIA,
        CD,
        SESSION_SERVICE,
        SESSIONS,
        SESSION,
        ACCOUNT_SERVICE,
        ACCOUNTS,
        ACCOUNT,
        ROLES,
        ROLE,
    ];
}

/// A resource's common properties.
fn identity(kind: Kind, uri: &str, id: &str, name: &str) -> Value {
    json!({
        "@odata.id": uri,
        "@odata.type": kind.odata_type(),
        "@odata.context": format!("/redfish/v1/$metadata#{0}.{0}", kind.namespace),
        "Id": id,
        "Name": name,
    })
}

/// A link.
fn link(uri: &str) -> Value {
    json!({ "@odata.id": uri })
}

/// A collection of `members`.
pub(crate) fn collection(kind: Kind, uri: &str, name: &str, members: &[String]) -> Value {
    let links: Vec<Value> = members.iter().map(|m| link(m)).collect();
    json!({
        "@odata.id": uri,
        "@odata.type": kind.odata_type(),
        "@odata.context": format!("/redfish/v1/$metadata#{0}.{0}", kind.namespace),
        "Name": name,
        "Members": links,
        "Members@odata.count": members.len(),
    })
}

/// `/redfish`: the versions served.
pub(crate) fn versions() -> Value {
    json!({ "v1": ROOT })
}

/// The service root.
pub(crate) fn service_root(uuid: &str) -> Value {
    let mut root = identity(kinds::SERVICE_ROOT, ROOT, "RootService", "Root Service");
    let extra = json!({
        "RedfishVersion": REDFISH_VERSION,
        "UUID": uuid,
        "Product": "ichor-sim BMC",
        "Vendor": "Ichor",
        "ProtocolFeaturesSupported": {
            "ExpandQuery": {"ExpandAll": false, "Levels": false, "Links": false, "NoLinks": false},
            "FilterQuery": false,
            "SelectQuery": false,
            "OnlyMemberQuery": false,
            "ExcerptQuery": false,
        },
        "Systems": link(SYSTEMS),
        "Managers": link(MANAGERS),
        "SessionService": link(SESSION_SERVICE),
        "AccountService": link(ACCOUNT_SERVICE),
        "Links": {"Sessions": link(SESSIONS)},
    });
    merge(&mut root, extra);
    root
}

/// The OData service document.
pub(crate) fn odata() -> Value {
    let entry = |name: &str, url: &str| json!({"name": name, "kind": "Singleton", "url": url});
    json!({
        "@odata.context": "/redfish/v1/$metadata",
        "value": [
            entry("Service", ROOT),
            entry("Systems", SYSTEMS),
            entry("Managers", MANAGERS),
            entry("SessionService", SESSION_SERVICE),
            entry("AccountService", ACCOUNT_SERVICE),
            entry("Sessions", SESSIONS),
        ],
    })
}

/// `$metadata`: a reference to the DMTF CSDL of every type served, and the entity container.
pub(crate) fn metadata() -> String {
    let mut xml = String::from(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<edmx:Edmx xmlns:edmx=\"http://docs.oasis-open.org/odata/ns/edmx\" Version=\"4.0\">\n",
    );
    for kind in kinds::ALL {
        xml.push_str(&format!(
            "  <edmx:Reference Uri=\"http://redfish.dmtf.org/schemas/v1/{0}_v1.xml\">\n    <edmx:Include Namespace=\"{0}\"/>\n",
            kind.namespace
        ));
        if !kind.version.is_empty() {
            xml.push_str(&format!(
                "    <edmx:Include Namespace=\"{}.{}\"/>\n",
                kind.namespace, kind.version
            ));
        }
        xml.push_str("  </edmx:Reference>\n");
    }
    xml.push_str(
        "  <edmx:DataServices>\n    <Schema xmlns=\"http://docs.oasis-open.org/odata/ns/edm\" Namespace=\"Service\">\n      <EntityContainer Name=\"Service\" Extends=\"ServiceRoot.v1_20_0.ServiceContainer\"/>\n    </Schema>\n  </edmx:DataServices>\n</edmx:Edmx>\n",
    );
    xml
}

/// What the system resource shows of the machine.
#[derive(Debug, Clone)]
pub(crate) struct SystemView {
    /// The UUID as reported.
    pub(crate) uuid: String,
    /// Powered on.
    pub(crate) powered: bool,
    /// The firmware's settings.
    pub(crate) settings: Settings,
}

/// The one system.
pub(crate) fn system(view: &SystemView) -> Value {
    let mut system = identity(kinds::SYSTEM, SYSTEM, "system", "System");
    let state = if view.powered {
        "Enabled"
    } else {
        "StandbyOffline"
    };
    let extra = json!({
        "SystemType": "Physical",
        "Manufacturer": "QEMU",
        "Model": "Standard PC (Q35 + ICH9, 2009)",
        "UUID": view.uuid,
        "PowerState": if view.powered { "On" } else { "Off" },
        "Status": {"State": state, "Health": "OK"},
        "Boot": {
            "BootSourceOverrideEnabled": view.settings.enabled.name(),
            "BootSourceOverrideEnabled@Redfish.AllowableValues": Enabled::names(),
            "BootSourceOverrideTarget": view.settings.target.name(),
            "BootSourceOverrideTarget@Redfish.AllowableValues": Target::names(),
            "BootSourceOverrideMode": "UEFI",
            "BootSourceOverrideMode@Redfish.AllowableValues": ["UEFI"],
        },
        "Actions": {
            "#ComputerSystem.Reset": {
                "target": RESET,
                "ResetType@Redfish.AllowableValues": RESET_TYPES,
            },
        },
        "Links": {"ManagedBy": [link(MANAGER)]},
    });
    merge(&mut system, extra);
    system
}

/// The one manager, the BMC.
pub(crate) fn manager(uuid: &str, service_uuid: &str) -> Value {
    let mut manager = identity(kinds::MANAGER, MANAGER, "bmc", "Manager");
    let extra = json!({
        "ManagerType": "BMC",
        "Manufacturer": "Ichor",
        "Model": "ichor-sim BMC",
        "FirmwareVersion": env!("CARGO_PKG_VERSION"),
        "UUID": uuid,
        "ServiceEntryPointUUID": service_uuid,
        "PowerState": "On",
        "Status": {"State": "Enabled", "Health": "OK"},
        "VirtualMedia": link(MEDIA),
        "Links": {"ManagerForServers": [link(SYSTEM)]},
    });
    merge(&mut manager, extra);
    manager
}

/// The virtual CD.
pub(crate) fn cd(settings: &Settings) -> Value {
    let mut cd = identity(kinds::CD, CD, "Cd", "Virtual CD");
    let media = settings.media.as_ref();
    let extra = json!({
        "MediaTypes": ["CD", "DVD"],
        "Image": media.map(|m| m.url.clone()),
        "ImageName": media.map(|m| m.iso.file.clone()),
        "Inserted": media.is_some_and(|m| m.inserted),
        "WriteProtected": media.is_none_or(|m| m.write_protected),
        "ConnectedVia": if media.is_some() { "URI" } else { "NotConnected" },
        "TransferMethod": "Stream",
        "Actions": {
            "#VirtualMedia.InsertMedia": {"target": INSERT},
            "#VirtualMedia.EjectMedia": {"target": EJECT},
        },
    });
    merge(&mut cd, extra);
    cd
}

/// The session service.
pub(crate) fn session_service() -> Value {
    let mut service = identity(
        kinds::SESSION_SERVICE,
        SESSION_SERVICE,
        "SessionService",
        "Session Service",
    );
    merge(
        &mut service,
        json!({
            "ServiceEnabled": true,
            "SessionTimeout": 1800,
            "Status": {"State": "Enabled", "Health": "OK"},
            "Sessions": link(SESSIONS),
        }),
    );
    service
}

/// A session's URI.
pub(crate) fn session_uri(id: &str) -> String {
    format!("{SESSIONS}/{id}")
}

/// A session.
pub(crate) fn session(session: &Session) -> Value {
    let mut value = identity(
        kinds::SESSION,
        &session_uri(&session.id),
        &session.id,
        "User Session",
    );
    merge(
        &mut value,
        json!({"UserName": session.user, "SessionType": "Redfish", "Password": null}),
    );
    value
}

/// The account service.
pub(crate) fn account_service() -> Value {
    let mut service = identity(
        kinds::ACCOUNT_SERVICE,
        ACCOUNT_SERVICE,
        "AccountService",
        "Account Service",
    );
    merge(
        &mut service,
        json!({
            "ServiceEnabled": true,
            "HTTPBasicAuth": "Enabled",
            "LocalAccountAuth": "Enabled",
            "Status": {"State": "Enabled", "Health": "OK"},
            "Accounts": link(ACCOUNTS),
            "Roles": link(ROLES),
        }),
    );
    service
}

/// An account's URI.
pub(crate) fn account_uri(id: &str) -> String {
    format!("{ACCOUNTS}/{id}")
}

/// An account (`Password` is always null when read).
pub(crate) fn account(account: &Account) -> Value {
    let mut value = identity(
        kinds::ACCOUNT,
        &account_uri(&account.id),
        &account.id,
        "User Account",
    );
    merge(
        &mut value,
        json!({
            "UserName": account.username,
            "Password": null,
            "RoleId": account.role,
            "Enabled": account.enabled,
            "Locked": false,
            "AccountTypes": ["Redfish"],
            "Links": {"Role": link(&role_uri(account.role))},
        }),
    );
    value
}

/// A role's URI.
pub(crate) fn role_uri(id: &str) -> String {
    format!("{ROLES}/{id}")
}

/// A predefined role.
pub(crate) fn role(id: &str, privileges: &[&str]) -> Value {
    let mut role = identity(kinds::ROLE, &role_uri(id), id, &format!("{id} Role"));
    merge(
        &mut role,
        json!({"RoleId": id, "IsPredefined": true, "AssignedPrivileges": privileges}),
    );
    role
}

/// Adds `extra`'s properties to `value`.
fn merge(value: &mut Value, extra: Value) {
    if let (Some(object), Value::Object(extra)) = (value.as_object_mut(), extra) {
        object.extend(extra);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versioned_types_name_their_schema_version() {
        assert_eq!(
            kinds::SYSTEM.odata_type(),
            "#ComputerSystem.v1_27_0.ComputerSystem"
        );
        assert_eq!(
            kinds::SYSTEM.schema(),
            "https://redfish.dmtf.org/schemas/v1/ComputerSystem.v1_27_0.json"
        );
        assert_eq!(
            kinds::SYSTEMS.odata_type(),
            "#ComputerSystemCollection.ComputerSystemCollection"
        );
    }

    #[test]
    fn metadata_holds_the_entity_container() {
        let xml = metadata();
        assert!(xml.contains("<EntityContainer Name=\"Service\""));
        assert!(xml.contains("Namespace=\"VirtualMedia.v1_6_5\""));
    }
}
