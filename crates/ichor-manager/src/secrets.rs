//! The cluster's Secrets: the secrets bundle (given, or generated once with **no owner
//! reference**, so deleting the cluster never garbage-collects the CA keys), and the published
//! talosconfig and workload kubeconfig. Secret contents are never logged.

use std::collections::BTreeMap;

use ichor_api::TalosCluster;
use ichor_api::names::labels;
use ichor_render::{Contract, SecretsBundle};
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
    /// The Secret has no bundle or an invalid one.
    #[error("Secret {secret} does not hold a valid bundle under {BUNDLE_KEY}: {reason}")]
    Invalid {
        /// The Secret.
        secret: String,
        /// What is wrong (never the secret values).
        reason: String,
    },
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

/// Reads the bundle; generates and stores it first when the cluster names none and it does not
/// exist yet (create-if-absent: a concurrent creator wins and its bundle is read).
pub async fn bundle(
    client: &kube::Client,
    cluster: &TalosCluster,
) -> Result<Result<SecretsBundle, BundleUnavailable>, Error> {
    let namespace = cluster.namespace().unwrap_or_default();
    let secrets: Api<Secret> = Api::namespaced(client.clone(), &namespace);
    let name = bundle_secret_name(cluster);
    let existing = match secrets.get_opt(&name).await? {
        Some(secret) => secret,
        None if cluster.spec.secrets_ref.is_some() => {
            return Ok(Err(BundleUnavailable::Missing(name)));
        }
        None => {
            let contract =
                Contract::from_version(&cluster.spec.talos_version).map_err(|e| Error::Spec {
                    field: "spec.talosVersion",
                    problem: e.to_string(),
                })?;
            let generated = SecretsBundle::generate(contract).map_err(Error::Bundle)?;
            let yaml = generated.to_yaml().map_err(Error::Bundle)?;
            // No owner reference: the CA keys must outlive an accidental cluster delete.
            let secret = Secret {
                metadata: labelled(cluster, &name),
                type_: Some("Opaque".into()),
                data: Some(BTreeMap::from([(
                    BUNDLE_KEY.to_owned(),
                    ByteString(yaml.into_bytes()),
                )])),
                ..Default::default()
            };
            match secrets.create(&PostParams::default(), &secret).await {
                Ok(created) => created,
                Err(kube::Error::Api(status)) if status.is_already_exists() => {
                    secrets.get(&name).await?
                }
                Err(error) => return Err(error.into()),
            }
        }
    };
    let Some(bytes) = existing.data.as_ref().and_then(|d| d.get(BUNDLE_KEY)) else {
        return Ok(Err(BundleUnavailable::Invalid {
            secret: name,
            reason: format!("no key {BUNDLE_KEY}"),
        }));
    };
    let text = String::from_utf8_lossy(&bytes.0);
    Ok(SecretsBundle::from_yaml(&text)
        .and_then(|b| b.validate().map(|()| b))
        .map_err(|e| BundleUnavailable::Invalid {
            secret: name,
            reason: e.to_string(),
        }))
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
