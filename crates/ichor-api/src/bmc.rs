//! A machine's BMC (issue 42): where its Redfish service is, the Secret with its credentials,
//! its TLS trust and which system is the machine (`spec.bmc`), and what the manager last read
//! of it (`status.bmc`, a status group of its own with the condition `BmcReachable`).
//!
//! Only the description lives here; reading the BMC is the manager's (`ichor-redfish`).

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::KubeSchema;
use serde::{Deserialize, Serialize};

use crate::common::LocalObjectReference;

/// The CEL rule on `spec.bmc.address`: an `https` origin, no user info, path, query or fragment.
const ADDRESS_RULE: &str = r"self.matches('^https://([A-Za-z0-9]([A-Za-z0-9.-]*[A-Za-z0-9])?|\\[[0-9A-Fa-f:.]+\\])(:[0-9]{1,5})?/?$')";

/// The CEL rule on `spec.bmc`: exactly one of `caSecretRef` and `insecureSkipVerify: true`.
const TRUST_RULE: &str =
    "has(self.caSecretRef) != (has(self.insecureSkipVerify) && self.insecureSkipVerify)";

/// Where a machine's BMC is and how it is reached and trusted.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[x_kube(validation = kube::core::Rule::new(TRUST_RULE).message("spec.bmc needs exactly one of caSecretRef (a CA bundle the BMC's certificate is signed by) and insecureSkipVerify: true"))]
pub struct BmcSpec {
    /// The BMC's Redfish origin, `https://host[:port]`: no user info, no path.
    #[schemars(length(min = 9, max = 270))]
    #[x_kube(validation = kube::core::Rule::new(ADDRESS_RULE).message("spec.bmc.address must be an https:// origin (https://host[:port]) with no user info and no path"))]
    pub address: String,
    /// A Secret in the machine's namespace with the keys `username` and `password`.
    pub credentials_secret_ref: LocalObjectReference,
    /// A Secret in the machine's namespace holding the CA bundle (PEM) the BMC's certificate is
    /// signed by, under `key`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_secret_ref: Option<SecretKeyReference>,
    /// Trusts any certificate the BMC presents: an explicit opt-in for BMCs with self-signed
    /// certificates; anyone on the path can then pose as the BMC and read its credentials.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub insecure_skip_verify: Option<bool>,
    /// The Redfish system's `Id`; without it, the system whose UUID is the node's SMBIOS UUID,
    /// or the only system while the node's UUID is not known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(min = 1, max = 128))]
    pub system_id: Option<String>,
}

/// One key of a Secret in the object's namespace.
#[derive(KubeSchema, Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SecretKeyReference {
    /// The Secret's name.
    #[schemars(length(min = 1, max = 253))]
    pub name: String,
    /// The key in its data.
    #[schemars(length(min = 1, max = 253))]
    pub key: String,
}

/// The Secret keys of a BMC's credentials.
pub mod keys {
    /// The user name's key.
    pub const USERNAME: &str = "username";
    /// The password's key.
    pub const PASSWORD: &str = "password";
}

/// What the manager last read of a machine's BMC, with the condition `BmcReachable`.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MachineBmc {
    /// The BMC as last read; unset for a machine without `spec.bmc`.
    #[serde(rename = "bmc", default, skip_serializing_if = "Option::is_none")]
    pub observed: Option<BmcObservation>,
}

/// One read of a BMC: its system's power state and health, as the BMC reports them.
#[derive(KubeSchema, Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BmcObservation {
    /// The system's `PowerState` (`On`, `Off`, `PoweringOn`, `PoweringOff`, `Paused`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub power_state: Option<String>,
    /// The system's `Status.Health` (`OK`, `Warning`, `Critical`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub health: Option<String>,
    /// The system's `Status.State` (`Enabled`, `Disabled`, …).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub state: Option<String>,
    /// The system's `Id`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 128))]
    pub system_id: Option<String>,
    /// The system's `UUID`, as the BMC reports it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(length(max = 64))]
    pub uuid: Option<String>,
    /// When the BMC was last read (answered or not).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_at: Option<Time>,
    /// The `metadata.generation` whose `spec.bmc` was read: a changed spec is read again at once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}
