//! Client credentials for a cluster: an `os:admin` talosconfig for its nodes and an admin
//! kubeconfig for its Kubernetes API, minted from the bundle's CAs, and what a published file
//! says about itself (where it points, when its certificate expires).

use std::time::{Duration, SystemTime};

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

/// A minted credentials file and when its certificate expires.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Minted {
    /// The file.
    pub file: CredentialsFile,
    /// When its client certificate expires.
    pub expires: SystemTime,
}

/// The `notAfter` of the certificate `pem` just minted.
fn expiry(pem: &str, what: &'static str) -> Result<SystemTime, PkiError> {
    certificate_validity(pem.as_bytes())
        .map(|(_, not_after)| not_after)
        .ok_or(PkiError::Sign { what })
}

/// A talosconfig with one context named after the cluster: `os:admin`, one-year certificate,
/// the given endpoints and nodes.
pub fn talosconfig(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoints: &[String],
    nodes: &[String],
) -> Result<CredentialsFile, PkiError> {
    talosconfig_for(bundle, cluster_name, endpoints, nodes, CLIENT_TTL).map(|m| m.file)
}

/// As [`talosconfig`], with a certificate valid for `ttl`.
pub fn talosconfig_for(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoints: &[String],
    nodes: &[String],
    ttl: Duration,
) -> Result<Minted, PkiError> {
    let client = pki::client_certificate(bundle, "ichor", Role::Admin, ttl)?;
    let expires = expiry(&client.cert_pem, "talosconfig")?;
    let file = to_yaml(&json!({
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
    }))?;
    Ok(Minted { file, expires })
}

/// An admin kubeconfig for the workload cluster: a `system:masters` client certificate signed by
/// the bundle's Kubernetes CA, one-year lifetime, talking to `endpoint`.
pub fn admin_kubeconfig(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoint: &str,
) -> Result<CredentialsFile, PkiError> {
    kubeconfig_for(bundle, cluster_name, endpoint, "admin", CLIENT_TTL).map(|m| m.file)
}

/// A `system:masters` kubeconfig for the workload cluster whose certificate names `user` and
/// is valid for `ttl`, talking to `endpoint`.
pub fn kubeconfig_for(
    bundle: &SecretsBundle,
    cluster_name: &str,
    endpoint: &str,
    user: &str,
    ttl: Duration,
) -> Result<Minted, PkiError> {
    let issuer = bundle.k8s_issuer()?;
    let key = KeyPair::generate().map_err(|_| PkiError::Sign { what: "kubeconfig" })?;
    let params = pki::leaf_params(
        user,
        Some("system:masters"),
        ExtendedKeyUsagePurpose::ClientAuth,
        ttl,
    );
    let cert = params
        .signed_by(&key, &issuer)
        .map_err(|_| PkiError::Sign { what: "kubeconfig" })?;
    let expires = expiry(&cert.pem(), "kubeconfig")?;
    let user = format!("{user}@{cluster_name}");
    let file = to_yaml(&json!({
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
    }))?;
    Ok(Minted { file, expires })
}

/// What a published talosconfig or kubeconfig says: where it points, its CA, and its client
/// certificate's validity.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Published {
    /// The kubeconfig's server, or the talosconfig context's endpoints.
    pub endpoints: Vec<String>,
    /// The talosconfig context's nodes (empty for a kubeconfig).
    pub nodes: Vec<String>,
    /// The CA certificate it trusts, PEM.
    pub ca_pem: String,
    /// When its client certificate became valid.
    pub not_before: SystemTime,
    /// When its client certificate expires.
    pub not_after: SystemTime,
}

/// The validity (`notBefore`, `notAfter`) of the first certificate of `pem`.
pub fn certificate_validity(pem: &[u8]) -> Option<(SystemTime, SystemTime)> {
    let (_, pem) = x509_parser::pem::parse_x509_pem(pem).ok()?;
    let (_, cert) = x509_parser::parse_x509_certificate(&pem.contents).ok()?;
    let at = |t: x509_parser::time::ASN1Time| {
        let secs = u64::try_from(t.timestamp()).ok()?;
        SystemTime::UNIX_EPOCH.checked_add(Duration::from_secs(secs))
    };
    Some((
        at(cert.validity().not_before)?,
        at(cert.validity().not_after)?,
    ))
}

fn decoded(value: &serde_json::Value) -> Option<Vec<u8>> {
    STANDARD.decode(value.as_str()?).ok()
}

fn strings(value: &serde_json::Value) -> Vec<String> {
    value
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str().map(str::to_owned))
        .collect()
}

/// What the talosconfig `text` says in its context `cluster_name`; `None` if it is unreadable.
pub fn read_talosconfig(text: &str, cluster_name: &str) -> Option<Published> {
    let value: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    let context = value.get("contexts")?.get(cluster_name)?;
    let (not_before, not_after) = certificate_validity(&decoded(&context["crt"])?)?;
    Some(Published {
        endpoints: strings(&context["endpoints"]),
        nodes: strings(&context["nodes"]),
        ca_pem: String::from_utf8(decoded(&context["ca"])?).ok()?,
        not_before,
        not_after,
    })
}

/// What the kubeconfig `text` (its first cluster and user) says; `None` if it is unreadable.
pub fn read_kubeconfig(text: &str) -> Option<Published> {
    let value: serde_json::Value = serde_saphyr::from_str(text).ok()?;
    let cluster = &value.get("clusters")?.get(0)?["cluster"];
    let user = &value.get("users")?.get(0)?["user"];
    let (not_before, not_after) =
        certificate_validity(&decoded(&user["client-certificate-data"])?)?;
    Some(Published {
        endpoints: vec![cluster["server"].as_str()?.to_owned()],
        nodes: Vec::new(),
        ca_pem: String::from_utf8(decoded(&cluster["certificate-authority-data"])?).ok()?,
        not_before,
        not_after,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle() -> SecretsBundle {
        SecretsBundle::generate(crate::Contract::from_version("v1.14.0").expect("contract"))
            .expect("bundle")
    }

    fn secs(t: SystemTime) -> u64 {
        t.duration_since(SystemTime::UNIX_EPOCH)
            .expect("after 1970")
            .as_secs()
    }

    #[test]
    fn a_minted_kubeconfig_reads_back_with_its_server_ca_and_expiry() {
        let b = bundle();
        let ttl = Duration::from_secs(45);
        let minted =
            kubeconfig_for(&b, "lab", "https://10.0.0.1:6443", "ichor-manager", ttl).expect("mint");
        let read = read_kubeconfig(&minted.file.0).expect("readable");
        assert_eq!(read.endpoints, ["https://10.0.0.1:6443"]);
        assert_eq!(read.ca_pem, b.certs.k8s.crt.0);
        assert_eq!(secs(read.not_after), secs(minted.expires));
        let now = secs(SystemTime::now());
        assert!((now + 44..=now + 46).contains(&secs(read.not_after)));
        assert!(read.not_before < read.not_after);
        assert!(read_kubeconfig("not: [a kubeconfig").is_none());
    }

    #[test]
    fn a_minted_talosconfig_reads_back_with_its_targets_and_expiry() {
        let b = bundle();
        let endpoints = vec!["10.0.0.2".to_owned()];
        let nodes = vec!["10.0.0.2".to_owned(), "10.0.0.3".to_owned()];
        let minted = talosconfig_for(&b, "lab", &endpoints, &nodes, Duration::from_secs(3600))
            .expect("mint");
        let read = read_talosconfig(&minted.file.0, "lab").expect("readable");
        assert_eq!((read.endpoints, read.nodes), (endpoints, nodes));
        assert_eq!(read.ca_pem, b.certs.os.crt.0);
        assert_eq!(secs(read.not_after), secs(minted.expires));
        assert!(read_talosconfig(&minted.file.0, "other").is_none());
    }
}
