//! Pure rendering: Talos secrets bundles ([`bundle`]), PKI helpers ([`pki`]), machine-config
//! documents per role and version contract ([`render`]) with patches ([`patch`]), and client
//! credentials.
//!
//! This crate does no network I/O and knows nothing of Kubernetes; it reads randomness only to
//! generate new keys. Rendering is deterministic: same inputs, same bytes.
#![forbid(unsafe_code)]

pub mod bundle;
pub mod credentials;
pub mod hardware;
pub mod patch;
pub mod pki;
pub mod render;

pub use bundle::{BundleError, SecretsBundle};
pub use render::{RenderError, RenderInput, Rendered, config_hash, render, render_machine};

/// A Talos version contract: what a config is rendered for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Contract {
    /// Talos 1.13: the classic v1alpha1 document with `machine.install`.
    V1_13,
    /// Talos 1.14: a slim v1alpha1 document plus typed documents.
    V1_14,
}

/// The contract a Talos version asks for is not supported.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("Talos version {version} is not supported: Ichor renders for contracts v1.13 and v1.14")]
pub struct UnsupportedVersion {
    /// The version given.
    pub version: String,
}

impl Contract {
    /// The contract of a Talos version such as `v1.14.0` or `1.13.9`. Versions after the newest
    /// known contract render with the newest one.
    pub fn from_version(version: &str) -> Result<Self, UnsupportedVersion> {
        let unsupported = || UnsupportedVersion {
            version: version.to_owned(),
        };
        let mut parts = version.trim_start_matches('v').split(['.', '-']);
        let major: u32 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(unsupported)?;
        let minor: u32 = parts
            .next()
            .and_then(|p| p.parse().ok())
            .ok_or_else(unsupported)?;
        match (major, minor) {
            (1, 13) => Ok(Self::V1_13),
            (1, m) if m >= 14 => Ok(Self::V1_14),
            _ => Err(unsupported()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn contracts_come_from_versions() {
        assert_eq!(Contract::from_version("v1.13.9"), Ok(Contract::V1_13));
        assert_eq!(Contract::from_version("1.14.0"), Ok(Contract::V1_14));
        assert_eq!(Contract::from_version("v1.14.0-rc.1"), Ok(Contract::V1_14));
        assert_eq!(Contract::from_version("v1.15.2"), Ok(Contract::V1_14));
        let err = Contract::from_version("v1.12.4").expect_err("too old");
        assert!(
            err.to_string().contains("contracts v1.13 and v1.14"),
            "{err}"
        );
        assert!(Contract::from_version("latest").is_err());
    }
}
