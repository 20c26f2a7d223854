//! The cluster's Secrets: the secrets bundle (given, or generated once with **no owner
//! reference**, so deleting the cluster never garbage-collects the CA keys), and the published
//! talosconfig and workload kubeconfig. Secret contents are never logged.

use std::collections::{BTreeMap, HashMap};
use std::sync::{LazyLock, Mutex};

use ichor_api::TalosCluster;
use ichor_api::names::{labels, reasons};
use ichor_deleteguard::{BundleStep, Found, bundle_step};
use ichor_render::{BundleError, Contract, SecretsBundle};
use k8s_openapi::ByteString;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ObjectMeta, PostParams};
use kube::{Resource as _, ResourceExt as _};

use crate::Error;

/// The Secret keys, shared with the plugin.
pub use ichor_api::names::secrets::{BUNDLE_KEY, KUBECONFIG_KEY, TALOSCONFIG_KEY};

/// The name of the bundle Secret: the referenced one, or `<cluster>-secrets`.
pub fn bundle_secret_name(cluster: &TalosCluster) -> String {
    cluster.spec.secrets_ref.as_ref().map_or_else(
        || format!("{}-secrets", cluster.name_any()),
        |r| r.name.clone(),
    )
}

/// Why the bundle is not available.
#[derive(Debug, thiserror::Error)]
pub enum BundleUnavailable {
    /// The referenced Secret does not exist.
    #[error(
        "Secret {0} named by spec.secretsRef does not exist: create it with key {BUNDLE_KEY} (talosctl gen secrets), or remove secretsRef to have one generated"
    )]
    Missing(String),
    /// Not generated yet: the cluster controller generates it.
    #[error("Secret {0} with the cluster's secrets bundle is not generated yet")]
    NotYet(String),
    /// Gone although machines were configured with it: never regenerated.
    #[error(
        "Secret {0} with the cluster's secrets bundle is gone, and machines of this cluster were configured with it: a new bundle would carry another CA and cut them off, so none is generated and nothing is rendered or applied. Restore the Secret (key {BUNDLE_KEY}) from a backup; work resumes once it is back"
    )]
    Lost(String),
    /// Another bundle than the one the cluster was built with.
    #[error(
        "Secret {secret} holds a bundle whose OS CA ({found}) is not the one this cluster was built with ({recorded}): nothing is rendered or applied. Restore the original bundle under {BUNDLE_KEY}"
    )]
    Mismatch {
        /// The Secret.
        secret: String,
        /// The fingerprint the cluster recorded.
        recorded: String,
        /// The fingerprint found.
        found: String,
    },
    /// The Secret exists but its content is not a valid bundle.
    #[error("Secret {secret} does not hold a valid bundle under {BUNDLE_KEY}: {reason}")]
    Invalid {
        /// The Secret.
        secret: String,
        /// What is wrong.
        reason: String,
    },
}

impl BundleUnavailable {
    /// The condition reason.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::Lost(_) => reasons::SECRETS_BUNDLE_LOST,
            Self::Mismatch { .. } => reasons::SECRETS_BUNDLE_MISMATCH,
            Self::Missing(_) | Self::NotYet(_) | Self::Invalid { .. } => {
                reasons::SECRETS_BUNDLE_UNAVAILABLE
            }
        }
    }
}

fn labelled(cluster: &TalosCluster, name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.to_owned()),
        namespace: cluster.namespace(),
        labels: Some(BTreeMap::from([
            (labels::CLUSTER.to_owned(), cluster.name_any()),
            (
                labels::MANAGED_BY.to_owned(),
                labels::MANAGED_BY_VALUE.to_owned(),
            ),
        ])),
        ..Default::default()
    }
}

/// The fingerprint that identifies a bundle: `sha256:` and the hex digest of its OS CA
/// certificate's PEM (the same content hash as a config's, `ichor_render::config_hash`).
pub fn fingerprint(bundle: &SecretsBundle) -> String {
    ichor_render::config_hash(bundle.certs.os.crt.0.trim())
}

/// Reads the cluster's bundle for rendering and connecting; never generates one (only the
/// cluster controller does, in [`ensure`]). A bundle other than the one the cluster recorded
/// is refused.
pub async fn bundle(
    client: &kube::Client,
    cluster: &TalosCluster,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    let recorded = recorded(cluster);
    // Absent: lost once the cluster recorded a bundle, not generated yet before.
    load(client, cluster, recorded.is_some()).await
}

/// The cluster controller's read: generates and stores the bundle when the cluster names none,
/// none exists, and none of its machines was ever configured (`ever_configured`); otherwise as
/// [`bundle`] (a missing bundle of a configured cluster is lost, never regenerated).
pub async fn ensure(
    client: &kube::Client,
    cluster: &TalosCluster,
    ever_configured: bool,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    match load(client, cluster, ever_configured).await? {
        Err(BundleUnavailable::NotYet(name)) => {
            generate(client, cluster, &name).await?;
            load(client, cluster, ever_configured).await
        }
        other => Ok(other),
    }
}

/// The fingerprint the cluster recorded, if it ever used a bundle.
fn recorded(cluster: &TalosCluster) -> Option<&str> {
    cluster
        .status
        .as_ref()
        .and_then(|s| s.bundle_fingerprint.as_deref())
}

/// Reads and checks the bundle Secret (the planner's `bundle_step`).
async fn load(
    client: &kube::Client,
    cluster: &TalosCluster,
    ever_configured: bool,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let name = bundle_secret_name(cluster);
    let existing = secrets.get_opt(&name).await?;
    let parsed = match &existing {
        None => None,
        Some(secret) => {
            let Some(bytes) = secret.data.as_ref().and_then(|d| d.get(BUNDLE_KEY)) else {
                return Ok(Err(BundleUnavailable::Invalid {
                    secret: name,
                    reason: format!("no key {BUNDLE_KEY}"),
                }));
            };
            let text = String::from_utf8_lossy(&bytes.0);
            match parse(&text) {
                Ok(bundle) => Some(bundle),
                Err(e) => {
                    return Ok(Err(BundleUnavailable::Invalid {
                        secret: name,
                        reason: e.to_string(),
                    }));
                }
            }
        }
    };
    let found_print = parsed.as_ref().map(fingerprint);
    let found = found_print.as_deref().map_or(Found::Nothing, Found::Bundle);
    Ok(
        match bundle_step(
            found,
            recorded(cluster),
            ever_configured,
            cluster.spec.secrets_ref.is_some(),
        ) {
            BundleStep::Use => parsed.ok_or(BundleUnavailable::NotYet(name)),
            BundleStep::Generate => Err(BundleUnavailable::NotYet(name)),
            BundleStep::Missing => Err(BundleUnavailable::Missing(name)),
            BundleStep::Lost => Err(BundleUnavailable::Lost(name)),
            BundleStep::Mismatch { recorded, found } => Err(BundleUnavailable::Mismatch {
                secret: name,
                recorded,
                found,
            }),
        },
    )
}

/// Bundles parsed and validated, by the hash of their YAML. Validation checks every key, the
/// RSA service-account key above all, and was about a fifth of the manager's CPU over an idle
/// fleet of 1000 machines (ADR 0040); the same bytes always make the same bundle, so each
/// bundle is checked once. Kept for at most [`PARSED_KEPT`] bundles, then started afresh.
static PARSED: LazyLock<Mutex<HashMap<String, SecretsBundle>>> = LazyLock::new(Mutex::default);

/// How many parsed bundles [`PARSED`] keeps (one per cluster is what it needs).
const PARSED_KEPT: usize = 256;

/// `text` as a valid bundle: [`SecretsBundle::from_yaml`] then `validate`, once per content.
fn parse(text: &str) -> Result<SecretsBundle, BundleError> {
    let key = ichor_render::config_hash(text);
    let parsed = || crate::machine::lock(&PARSED);
    if let Some(bundle) = parsed().get(&key) {
        return Ok(bundle.clone());
    }
    let bundle = SecretsBundle::from_yaml(text).and_then(|b| b.validate().map(|()| b))?;
    let mut kept = parsed();
    if kept.len() >= PARSED_KEPT {
        kept.clear();
    }
    kept.insert(key, bundle.clone());
    Ok(bundle)
}

/// Generates a bundle and stores it under `name` (create-if-absent: a concurrent creator wins).
async fn generate(client: &kube::Client, cluster: &TalosCluster, name: &str) -> Result<(), Error> {
    let secrets: Api<Secret> =
        Api::namespaced(client.clone(), &cluster.namespace().unwrap_or_default());
    let contract =
        Contract::from_version(&cluster.spec.talos_version).map_err(|e| Error::Spec {
            field: "spec.talosVersion",
            problem: e.to_string(),
        })?;
    let generated = SecretsBundle::generate(contract).map_err(Error::Bundle)?;
    let yaml = generated.to_yaml().map_err(Error::Bundle)?;
    let secret = Secret {
        metadata: labelled(cluster, name),
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            BUNDLE_KEY.to_owned(),
            ByteString(yaml.into_bytes()),
        )])),
        ..Default::default()
    };
    match secrets.create(&PostParams::default(), &secret).await {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
        Err(error) => Err(error.into()),
    }
}

/// Creates (or, when `replace`, rewrites) a Secret owned by the cluster holding one key.
pub async fn publish(
    client: &kube::Client,
    cluster: &TalosCluster,
    name: &str,
    key: &str,
    value: &str,
    replace: bool,
) -> Result<(), Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let mut metadata = labelled(cluster, name);
    metadata.owner_references = cluster.controller_owner_ref(&()).map(|o| vec![o]);
    let mut secret = Secret {
        metadata,
        type_: Some("Opaque".into()),
        data: Some(BTreeMap::from([(
            key.to_owned(),
            ByteString(value.as_bytes().to_vec()),
        )])),
        ..Default::default()
    };
    match secrets.get_opt(name).await? {
        None => match secrets.create(&PostParams::default(), &secret).await {
            Ok(_) => Ok(()),
            Err(kube::Error::Api(status)) if status.is_already_exists() => Ok(()),
            Err(error) => Err(error.into()),
        },
        Some(existing) if replace => {
            secret.metadata.resource_version = existing.metadata.resource_version;
            secrets
                .replace(name, &PostParams::default(), &secret)
                .await?;
            Ok(())
        }
        Some(_) => Ok(()),
    }
}

/// Whether a Secret exists.
pub async fn exists(client: &kube::Client, namespace: &str, name: &str) -> Result<bool, Error> {
    Ok(Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .is_some())
}

/// Reads one key of a Secret.
pub async fn read(
    client: &kube::Client,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Option<String>, Error> {
    Ok(Api::<Secret>::namespaced(client.clone(), namespace)
        .get_opt(name)
        .await?
        .and_then(|s| s.data)
        .and_then(|d| {
            d.get(key)
                .map(|b| String::from_utf8_lossy(&b.0).into_owned())
        }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bundle_is_parsed_once_per_content_and_a_bad_one_is_refused_each_time() {
        let yaml = SecretsBundle::generate(Contract::V1_14)
            .expect("bundle")
            .to_yaml()
            .expect("yaml");
        let first = parse(&yaml).expect("valid");
        assert!(
            PARSED
                .lock()
                .expect("lock")
                .contains_key(&ichor_render::config_hash(&yaml)),
            "kept after the first parse"
        );
        assert_eq!(parse(&yaml).expect("kept"), first);
        let broken = yaml.replacen("bootstraptoken:", "bootstraptoken: x\n  unused:", 1);
        assert!(parse(&broken).is_err());
        assert!(parse(&broken).is_err(), "a refusal is never kept");
        assert!(
            !PARSED
                .lock()
                .expect("lock")
                .contains_key(&ichor_render::config_hash(&broken))
        );
    }
}
