//! Client credentials for a cluster: an `os:admin` talosconfig for its nodes and an admin
//! kubeconfig for its Kubernetes API, minted from the bundle's CAs.

use std::time::Duration;

use base64::Engine as _;
use base64::engine::general_purpose::STANDARD;
use rcgen::{ExtendedKeyUsagePurpose, KeyPair};
use serde_json::json;

use crate::bundle::SecretsBundle;
use crate::pki::{self, PkiError, Role};

/// One year: Talos's default client-certificate lifetime (talos-facts §2).
pub const CLIENT_TTL: Duration = Duration::from_secs(365 * 24 * 3600);

/// A credentials file's YAML. `Debug` hides it: it holds a private key.
#[derive(Clone, PartialEq, Eq)]
pub struct CredentialsFile(pub String);

impl std::fmt::Debug for CredentialsFile {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CredentialsFile(<redacted>)")
    }
}

fn to_yaml(value: &serde_json::Value) -> Result<CredentialsFile, PkiError> {
    serde_saphyr::to_string(value)
        .map(CredentialsFile)
        .map_err(|_| PkiError::Sign {
            what: "credentials",
        })
}

/// A talosconfig with one context named after the cluster: `os:admin`, one-year certificate,
/// the given endpoints and nodes.
pub fn talosconfig(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoints: &[String],
    nodes: &[String],
) -> Result<CredentialsFile, PkiError> {
    let client = pki::client_certificate(bundle, "ichor", Role::Admin, CLIENT_TTL)?;
    to_yaml(&json!({
        "context": cluster_name,
        "contexts": {
            cluster_name: {
                "endpoints": endpoints,
                "nodes": nodes,
                "ca": STANDARD.encode(&bundle.certs.os.crt.0),
                "crt": STANDARD.encode(&client.cert_pem),
                "key": STANDARD.encode(&client.key_pem)
            }
        }
    }))
}

/// An admin kubeconfig for the workload cluster: a `system:masters` client certificate signed by
/// the bundle's Kubernetes CA, one-year lifetime, talking to `endpoint`.
pub fn admin_kubeconfig(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoint: &str,
) -> Result<CredentialsFile, PkiError> {
    let issuer = bundle.k8s_issuer()?;
    let key = KeyPair::generate().map_err(|_| PkiError::Sign { what: "kubeconfig" })?;
    let params = pki::leaf_params(
        "admin",
        Some("system:masters"),
        ExtendedKeyUsagePurpose::ClientAuth,
        CLIENT_TTL,
    );
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|_| PkiError::Sign { what: "kubeconfig" })?;
    let user = format!("admin@{cluster_name}");
    to_yaml(&json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": cluster_name, "cluster": {
            "server": endpoint,
            "certificate-authority-data": STANDARD.encode(&bundle.certs.k8s.crt.0)
        }}],
        "users": [{"name": user, "user": {
            "client-certificate-data": STANDARD.encode(cert.pem()),
            "client-key-data": STANDARD.encode(key.serialize_pem())
        }}],
        "contexts": [{"name": user, "context": {"cluster": cluster_name, "user": user}}],
        "current-context": user
    }))
}
