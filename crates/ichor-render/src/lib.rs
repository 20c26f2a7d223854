//! Pure rendering of Talos Linux machine configuration: secrets bundles, the machine-config
//! documents of a node for its role and Talos version contract, config patches, and the
//! certificates and credentials minted from a bundle's CAs.
//!
//! # What it offers
//!
//! - [`SecretsBundle`]: generate one as `talosctl gen secrets` does
//!   ([`SecretsBundle::generate`]), or read, validate and write the `secrets.yaml` format.
//! - [`render()`]: cluster spec + role + install settings + patches + bundle → the exact
//!   multi-document YAML a node is given ([`Rendered`]), for contract v1.13 or v1.14
//!   ([`Contract`]), with its content hash ([`config_hash`]). [`render_machine`] does the same
//!   from a `TalosCluster` and a `TalosMachine`, exactly as the Ichor manager applies it.
//! - [`patch`]: strategic-merge and RFC 6902 config patches, applied cluster → class →
//!   machine, refused with the patch and path named when they touch a secret field or a legacy
//!   field that the contract replaces with a typed document.
//! - [`hardware::check`]: whether a rendered config fits a machine's recorded hardware (the
//!   install disk or disk selector matches a disk, every named link exists).
//! - [`upgrade`]: the versions a cluster's nodes are brought to (the accepted ones) and the
//!   upgrade a node needs to run them, as the manager decides and `kubectl ichor plan` forecasts.
//! - [`pki`]: role-bearing client certificates (`os:admin`, …) and node serving certificates
//!   from the bundle's OS CA; [`credentials`]: a talosconfig and an admin kubeconfig.
//!
//! # Quick start
//!
//! Render the config of a single control plane that installs to `/dev/vda`:
//!
//! ```
//! use std::collections::BTreeMap;
//!
//! use ichor_api::cluster::TalosClusterSpec;
//! use ichor_api::common::{InstallSpec, Role};
//! use ichor_render::{Contract, RenderInput, SecretsBundle, render};
//!
//! // The `spec` of a TalosCluster, as written in its manifest.
//! let cluster: TalosClusterSpec = serde_saphyr::from_str(
//!     "talosVersion: v1.14.1\n\
//!      kubernetesVersion: 1.36.3\n\
//!      endpoint: https://10.0.0.10:6443\n\
//!      controlPlane:\n  count: 1\n",
//! )?;
//! let contract = Contract::from_version(&cluster.talos_version)?;
//! let bundle = SecretsBundle::generate(contract)?;
//! let install = InstallSpec {
//!     disk: Some("/dev/vda".into()),
//!     ..Default::default()
//! };
//! let none = BTreeMap::new();
//! let rendered = render(&RenderInput {
//!     cluster_name: "lab",
//!     cluster: &cluster,
//!     role: Role::ControlPlane,
//!     hostname: Some("cp-1"),
//!     install: Some(&install),
//!     schematic: None,
//!     oldest_running: None,
//!     kubernetes: None,
//!     cert_sans: &[],
//!     node_labels: &none,
//!     node_taints: &none,
//!     patches: &[],
//!     bundle: &bundle,
//! })?;
//! assert_eq!(rendered.contract, Contract::V1_14);
//! // Contract 1.14: a slim v1alpha1 document first, then typed documents.
//! assert_eq!(rendered.documents[0]["machine"]["type"], "controlplane");
//! assert!(rendered.yaml.contains("kind: UnattendedInstallConfig"));
//! assert!(rendered.hash.starts_with("sha256:"));
//!
//! // An os:admin talosconfig for the node once it is configured (it holds a private key).
//! let talosconfig = ichor_render::credentials::talosconfig(
//!     &bundle,
//!     "lab",
//!     &["10.0.0.11".to_owned()],
//!     &["10.0.0.11".to_owned()],
//! )?;
//! assert!(talosconfig.0.contains("context: lab"));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! `rendered.yaml` is what a client sends with `ApplyConfiguration` (`ichor-talos`'s
//! `TalosClient::apply_configuration`); `rendered.hash` is what Ichor records to see drift.
//!
//! # What it does not do
//!
//! - **No I/O.** No network, no Kubernetes client, no files, no environment: inputs are values
//!   and outputs are values. Talking to a node is `ichor-talos`'s job; storing the bundle (a
//!   Secret, a vault) is the caller's, and so is keeping it secret (the `Debug` output of
//!   bundles, rendered configs, issued keys and credentials files hides the secrets).
//! - **Randomness only for new keys.** [`SecretsBundle::generate`] and the certificate minting
//!   in [`pki`] and [`credentials`] read the OS random source; [`render()`] never does: same
//!   inputs, same bytes.
//! - **Two contracts.** Talos v1.13 and v1.14 ([`Contract::from_version`]); later minors
//!   render with v1.14's shape, older ones are refused.
//! - **Not Talos's validator.** It refuses what it knows to be wrong (secret fields in patches,
//!   inputs a contract cannot express); that Talos accepts what it renders is checked in this
//!   crate's tests against Talos's own code (`tests/oracle.rs`), not at run time.
//! - **No fingerprints.** The certificate fingerprint a maintenance connection is pinned by is
//!   `ichor_talos::fingerprint_der` (docs/adr/0005).
//! - Its inputs are `ichor-api`'s types, so it depends on `ichor-api` (and through it on the
//!   `k8s-openapi`/`kube-core` type crates), never on a Kubernetes client.
#![forbid(unsafe_code)]

pub mod bundle;
pub mod credentials;
pub mod hardware;
pub mod patch;
pub mod pki;
pub mod render;
pub mod schematic;
pub mod upgrade;

pub use bundle::{BundleError, SecretsBundle};
pub use render::{
    MachineLayers, RenderError, RenderInput, Rendered, config_hash, contract_in_force,
    disabled_static_pods, installer_image, machine_schematic, render, render_machine,
    render_with_volumes,
};

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
